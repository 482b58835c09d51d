"""A small ResNet-style image classifier following HAT's model convention.

conv-BN-ReLU stem, residual ``BasicBlock`` stages (conv-BN-ReLU-conv-BN plus an identity or 1x1
conv-BN shortcut, residual add, ReLU), global average pooling and a linear head. Every conv-BN
pair is an ``nn.Sequential(conv, bn)``, so :class:`~hat_ignite.callbacks.fuse_bn.FuseBN` and
:func:`~hat_ignite.callbacks.fuse_bn.fuse_conv_bn_pairs` find it, and the network traces with
``torch.export`` as one graph for the int8 converters (``modules=["net"]``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch import nn

from hat_ignite.models.classifier import SelfLossClassifier

__all__ = ["ConvBN", "BasicBlock", "ResNetClassifier"]


def ConvBN(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:  # noqa: N802
    """``nn.Sequential(conv (no bias), BatchNorm2d)`` with "same" padding.

    >>> tuple(ConvBN(1, 4, 3, stride=2)(torch.rand(2, 1, 8, 8)).shape)
    (2, 4, 4, 4)
    """
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels),
    )


class BasicBlock(nn.Module):
    """ResNet's basic residual block: ``relu(conv_bn2(relu(conv_bn1(x))) + shortcut(x))``.

    The shortcut is the identity when shape is kept, else a 1x1 conv-BN with the block's stride.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: stride of the first conv (and of the shortcut).

    Example:
        >>> block = BasicBlock(8, 16, stride=2)
        >>> tuple(block(torch.rand(2, 8, 8, 8)).shape), type(block.shortcut).__name__
        ((2, 16, 4, 4), 'Sequential')
        >>> type(BasicBlock(8, 8).shortcut).__name__
        'Identity'
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv_bn1 = ConvBN(in_channels, out_channels, 3, stride)
        self.relu1 = nn.ReLU()
        self.conv_bn2 = ConvBN(out_channels, out_channels, 3)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = ConvBN(in_channels, out_channels, 1, stride)
        else:
            self.shortcut = nn.Identity()
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_bn2(self.relu1(self.conv_bn1(x)))
        return self.relu2(out + self.shortcut(x))


def _resnet(in_channels: int, stem_channels: int, widths: Sequence[int], blocks: Sequence[int], num_classes: int) -> nn.Sequential:
    layers: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(OrderedDict(conv_bn=ConvBN(in_channels, stem_channels, 3), relu=nn.ReLU()))),
    ]
    prev = stem_channels
    for i, (width, count) in enumerate(zip(widths, blocks)):
        stage = [BasicBlock(prev, width, stride=1 if i == 0 else 2)]
        stage += [BasicBlock(width, width) for _ in range(count - 1)]
        layers.append((f"layer{i + 1}", nn.Sequential(*stage)))
        prev = width
    layers += [("pool", nn.AdaptiveAvgPool2d(1)), ("flatten", nn.Flatten(1)), ("fc", nn.Linear(prev, num_classes))]
    return nn.Sequential(OrderedDict(layers))


class ResNetClassifier(SelfLossClassifier):
    """A small ResNet for ``[B, C, H, W]`` images, trained by cross entropy, HAT-style outputs.

    Like :class:`~hat_ignite.models.mlp.MLPClassifier`, the model computes its own loss: in
    training mode it returns ``({"cls_loss": loss}, logits)``; in eval mode the ``[B,
    num_classes]`` logits. It takes a dict batch whole (``model({"img": x, "labels": y})``) or
    a tuple batch unpacked (``model(x, y)``). The network (stem, stages, pool, head) is
    ``self.net``: name it in the int8 converters (``modules=["net"]``) so the loss stays float.

    Args:
        in_channels: image channels (1 for the digits).
        num_classes: number of output classes.
        stem_channels: channels of the stem conv.
        widths: channels of each stage; stages after the first halve the resolution.
        blocks: ``BasicBlock`` count of each stage (an int: the same for every stage).
        input_key: key of the images in a dict batch.
        label_key: key of the labels in a dict batch.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> model = ResNetClassifier(widths=(8, 16), blocks=1)
        >>> batch = {"img": torch.rand(4, 1, 16, 16), "labels": torch.tensor([0, 1, 2, 3])}
        >>> losses, logits = model(batch)
        >>> sorted(losses), tuple(logits.shape)
        (['cls_loss'], (4, 10))
        >>> tuple(model.eval()(batch["img"]).shape)
        (4, 10)
    """

    input_noun = "image"

    def __init__(
        self,
        in_channels: int = 1,
        num_classes: int = 10,
        stem_channels: int = 16,
        widths: Sequence[int] = (16, 32, 64),
        blocks: Sequence[int] | int = 1,
        input_key: str = "img",
        label_key: str = "labels",
    ) -> None:
        super().__init__()
        widths = list(widths)
        counts = [blocks] * len(widths) if isinstance(blocks, int) else list(blocks)
        if not widths or len(counts) != len(widths) or min(counts) < 1:
            raise ValueError(
                f"ResNetClassifier: widths={widths} and blocks={blocks!r} must describe the same "
                f"non-empty list of stages, each with at least one block."
            )
        self.net = _resnet(in_channels, stem_channels, widths, counts, num_classes)
        self.num_classes = num_classes
        self.input_key = input_key
        self.label_key = label_key

    def logits(self, data: torch.Tensor) -> torch.Tensor:
        """The ``[B, num_classes]`` logits of ``data``."""
        return self.net(data)
