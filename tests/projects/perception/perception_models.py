"""A perception project's own modules: nets shaped as torchvision's and as HAT's detection nets.

Registered with HAT's registry, as a HAT project's model files are. Written the way torchvision
writes them: a ``BasicBlock`` / ``Bottleneck`` applies its one ``self.relu`` two or three times,
MobileNetV2's blocks are ``Sequential`` subclasses with functional pooling after them, and the
detection head runs the same convs on every FPN level.
"""

import torch
import torch.nn.functional as F
from torch import nn

from hat.metrics.metric import EvalMetric
from hat.registry import OBJECT_REGISTRY


# ------------------------------------------------------------------------------ ResNet (torchvision's shape)
def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def conv1x1(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


def make_layer(block, inplanes, planes, blocks, stride=1):
    """torchvision's ``ResNet._make_layer``: the stage, and the channels it ends with."""
    downsample = None
    if stride != 1 or inplanes != planes * block.expansion:
        downsample = nn.Sequential(conv1x1(inplanes, planes * block.expansion, stride), nn.BatchNorm2d(planes * block.expansion))
    layers = [block(inplanes, planes, stride, downsample)]
    inplanes = planes * block.expansion
    layers += [block(inplanes, planes) for _ in range(1, blocks)]
    return nn.Sequential(*layers), inplanes


class ResNet(nn.Module):
    """torchvision's ResNet, with the width of its first stage as an argument."""

    def __init__(self, block, layers, num_classes=10, width=64, in_channels=3):
        super().__init__()
        self.inplanes = width
        self.conv1 = nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        layer, self.inplanes = make_layer(block, self.inplanes, planes, blocks, stride)
        return layer

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# ------------------------------------------------------------------------------ MobileNetV2 (torchvision's shape)
class Conv2dNormActivation(nn.Sequential):
    def __init__(self, cin, cout, kernel_size=3, stride=1, groups=1):
        super().__init__(
            nn.Conv2d(cin, cout, kernel_size, stride, (kernel_size - 1) // 2, groups=groups, bias=False),
            nn.BatchNorm2d(cout), nn.ReLU6(inplace=True))


class InvertedResidual(nn.Module):
    def __init__(self, inp, oup, stride, expand_ratio):
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers = [Conv2dNormActivation(inp, hidden, kernel_size=1)] if expand_ratio != 1 else []
        layers += [Conv2dNormActivation(hidden, hidden, stride=stride, groups=hidden),
                   nn.Conv2d(hidden, oup, 1, 1, 0, bias=False), nn.BatchNorm2d(oup)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2, with a width multiplier and settings as arguments."""

    def __init__(self, num_classes=10, width_mult=1.0, in_channels=3,
                 settings=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                           (6, 160, 3, 2), (6, 320, 1, 1)), last_channel=1280, dropout=0.2):
        super().__init__()
        cin = max(8, int(32 * width_mult))
        self.last_channel = max(8, int(last_channel * width_mult))
        features = [Conv2dNormActivation(in_channels, cin, stride=2)]
        for t, c, n, s in settings:
            cout = max(8, int(c * width_mult))
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(Conv2dNormActivation(cin, self.last_channel, kernel_size=1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(p=dropout), nn.Linear(self.last_channel, num_classes))

    def forward(self, x):
        x = self.features(x)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        return self.classifier(torch.flatten(x, 1))


# ------------------------------------------------------------------------------ HAT's classifier convention
@OBJECT_REGISTRY.register
class ImageClassifier(nn.Module):
    """``(preds, dict(ce=loss))`` in training, ``preds`` in eval, around a torchvision-shaped net.

    ``net``: ``"resnet18"`` (``BasicBlock`` x [2, 2, 2, 2]), ``"resnet50"`` (``Bottleneck``, one
    block a stage) or ``"mobilenet_v2"`` (the first four of torchvision's stages), ``width`` the
    channels of their first stage.
    """

    def __init__(self, net, num_classes=10, width=16):
        super().__init__()
        kinds = {
            "resnet18": lambda: ResNet(BasicBlock, [2, 2, 2, 2], num_classes, width),
            "resnet50": lambda: ResNet(Bottleneck, [1, 1, 1, 1], num_classes, width),
            "mobilenet_v2": lambda: MobileNetV2(num_classes, width_mult=width / 64, last_channel=256,
                                                settings=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 2, 2))),
        }
        self.net = kinds[net]()
        self.loss = nn.CrossEntropyLoss()

    def forward(self, data):
        preds = self.net(data["img"])
        if not self.training:
            return preds
        return preds, dict(ce=self.loss(preds, data["labels"]))


@OBJECT_REGISTRY.register
class ThreeChannels:
    """A batch transform: grey images as the three channels torchvision's nets take."""

    def __call__(self, batch):
        return dict(batch, img=batch["img"].expand(-1, 3, -1, -1))


# ------------------------------------------------------------------------------ detection (HAT's RetinaNet shape)
def draw_shape(kind, size):
    """A ``size x size`` patch: 0 a filled square, 1 a ring, 2 a plus sign, 3 a diagonal cross."""
    r = torch.arange(size, dtype=torch.float32)
    y, x = torch.meshgrid(r, r, indexing="ij")
    edge, mid, w = size - 1, (size - 1) / 2, max(1.0, size / 6)
    if kind == 0:
        patch = torch.ones(size, size)
    elif kind == 1:
        patch = ((x < w) | (y < w) | (x > edge - w) | (y > edge - w)).float()
    elif kind == 2:
        patch = (((x - mid).abs() < w) | ((y - mid).abs() < w)).float()
    else:
        patch = (((x - y).abs() < w) | ((x + y - edge).abs() < w)).float()
    return patch[None]


@OBJECT_REGISTRY.register
class ShapeBoxes(torch.utils.data.Dataset):
    """Canvases holding one to three shapes of three sizes: ``dict(img, gt_boxes [k, 4], gt_labels [k])``.

    Shapes (four kinds, see :func:`draw_shape`) sit near the centre of a cell of the level that
    learns their size, on a noisy background; each canvas is drawn from its index and ``seed``.
    """

    sizes = (12, 18, 26)
    strides = (8, 16, 32)

    def __init__(self, length=800, canvas=64, seed=0):
        self.length, self.canvas, self.seed = length, canvas, seed

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 100003 + i)
        img = 0.2 * torch.rand(1, self.canvas, self.canvas, generator=g)
        boxes, labels = [], []
        for _ in range(int(torch.randint(1, 4, (), generator=g))):
            level = int(torch.randint(len(self.sizes), (), generator=g))
            size, stride = self.sizes[level], self.strides[level]
            for _attempt in range(20):
                cx, cy = ((int(v) + 0.5) * stride for v in torch.randint(0, self.canvas // stride, (2,), generator=g))
                dx, dy = (int(v) for v in torch.randint(-2, 3, (2,), generator=g))
                x0 = min(max(int(cx - size / 2) + dx, 0), self.canvas - size)
                y0 = min(max(int(cy - size / 2) + dy, 0), self.canvas - size)
                box = torch.tensor([x0, y0, x0 + size, y0 + size], dtype=torch.float32)
                if all(box_iou(box[None], b[None]).item() == 0 for b in boxes):
                    break
            else:
                continue
            kind = int(torch.randint(4, (), generator=g))
            img[:, y0:y0 + size, x0:x0 + size] = torch.maximum(img[:, y0:y0 + size, x0:x0 + size], draw_shape(kind, size))
            boxes.append(box)
            labels.append(torch.tensor(kind))
        return dict(img=img, gt_boxes=torch.stack(boxes), gt_labels=torch.stack(labels))


def collate_boxes(items):
    """Images stacked; boxes and labels kept as lists (each image has its own number)."""
    return dict(img=torch.stack([it["img"] for it in items]),
                gt_boxes=[it["gt_boxes"] for it in items], gt_labels=[it["gt_labels"] for it in items])


OBJECT_REGISTRY.register(collate_boxes, name="collate_boxes")


def box_iou(a, b):
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area = lambda x: (x[:, 2:] - x[:, :2]).prod(-1)  # noqa: E731
    return inter / (area(a)[:, None] + area(b)[None, :] - inter)


def nms(boxes, scores, iou):
    order = scores.argsort(descending=True)
    keep = []
    while order.numel():
        i = order[0]
        keep.append(i)
        order = order[1:][box_iou(boxes[i][None], boxes[order[1:]])[0] < iou]
    return torch.stack(keep) if keep else order


class Backbone(nn.Module):
    """A small ResNet whose last three stages (strides 8, 16, 32) are the FPN's inputs."""

    def __init__(self, in_channels=1, width=16):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.layer1, channels = make_layer(BasicBlock, width, width, 1, stride=2)  # stride 4
        self.layer2, c3 = make_layer(BasicBlock, channels, width * 2, 1, stride=2)  # 8
        self.layer3, c4 = make_layer(BasicBlock, c3, width * 4, 1, stride=2)  # 16
        self.layer4, c5 = make_layer(BasicBlock, c4, width * 4, 1, stride=2)  # 32
        self.out_channels = [c3, c4, c5]

    def forward(self, x):
        c2 = self.layer1(self.stem(x))
        c3 = self.layer2(c2)
        c4 = self.layer3(c3)
        return [c3, c4, self.layer4(c4)]


class FPN(nn.Module):
    def __init__(self, in_channels, channels):
        super().__init__()
        self.lateral = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.output = nn.ModuleList(nn.Conv2d(channels, channels, 3, padding=1) for _ in in_channels)

    def forward(self, feats):
        laterals = [conv(f) for conv, f in zip(self.lateral, feats)]
        for i in range(len(laterals) - 1, 0, -1):
            laterals[i - 1] = laterals[i - 1] + F.interpolate(laterals[i], size=laterals[i - 1].shape[-2:], mode="nearest")
        return [conv(f) for conv, f in zip(self.output, laterals)]


class RetinaNetHead(nn.Module):
    """One classification and one box branch, their convs run on every level (HAT's RetinaNetHead)."""

    def __init__(self, channels, num_classes, stacked_convs=2):
        super().__init__()
        def tower():
            layers = []
            for _ in range(stacked_convs):
                layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.ReLU(inplace=True)]
            return nn.Sequential(*layers)
        self.cls_convs, self.reg_convs = tower(), tower()
        self.cls_out = nn.Conv2d(channels, num_classes + 1, 3, padding=1)
        self.reg_out = nn.Conv2d(channels, 4, 3, padding=1)

    def forward(self, feats):
        cls_scores = [self.cls_out(self.cls_convs(f)) for f in feats]
        bbox_preds = [self.reg_out(self.reg_convs(f)) for f in feats]
        return dict(cls_scores=cls_scores, bbox_preds=bbox_preds)


@OBJECT_REGISTRY.register
class ShapeRetinaNet(nn.Module):
    """HAT's detector convention: a dict of losses in training, per-image detections in eval.

    Each cell of each level predicts a class (or background) and the distances from its centre
    to the four sides of its box; a box is learnt at the level its size falls in. With
    ``deploy=True`` (HAT's ``deploy_model``) there are no targets or losses and the forward returns
    the head's outputs flattened over the levels: ``dict(cls_scores=[N, cells, C + 1],
    bbox_preds=[N, cells, 4])``.
    """

    strides = (8, 16, 32)
    size_ranges = ((0, 16), (16, 24), (24, float("inf")))

    def __init__(self, num_classes=4, width=16, channels=32, score_thresh=0.3, nms_thresh=0.5, deploy=False):
        super().__init__()
        self.num_classes = num_classes
        self.backbone = Backbone(width=width)
        self.neck = FPN(self.backbone.out_channels, channels)
        self.head = RetinaNetHead(channels, num_classes)
        self.score_thresh, self.nms_thresh, self.deploy = score_thresh, nms_thresh, deploy

    def forward(self, data):
        outs = self.head(self.neck(self.backbone(data["img"])))
        cls = torch.cat([c.flatten(2).transpose(1, 2) for c in outs["cls_scores"]], 1)
        reg = torch.cat([r.flatten(2).transpose(1, 2) for r in outs["bbox_preds"]], 1)
        if self.deploy:
            return dict(cls_scores=cls, bbox_preds=reg)
        cells, level_of = self._cells([c.shape[-2:] for c in outs["cls_scores"]], cls.device)
        strides = torch.tensor(self.strides, device=cls.device)[level_of].float()
        if self.training:
            return self._losses(cls, reg, cells, level_of, strides, data["gt_boxes"], data["gt_labels"])
        return self._detections(cls, reg, cells, strides)

    def _cells(self, sizes, device):
        """Every cell's centre in pixels, and its level, in the order the outputs are flattened."""
        centres, levels = [], []
        for level, (h, w) in enumerate(sizes):
            ys, xs = torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij")
            centres.append(torch.stack([xs.flatten() + 0.5, ys.flatten() + 0.5], 1) * self.strides[level])
            levels.append(torch.full((h * w,), level, device=device))
        return torch.cat(centres), torch.cat(levels)

    def _targets(self, cells, level_of, strides, boxes, labels):
        cls_t = torch.zeros(len(cells), dtype=torch.long, device=cells.device)
        reg_t = torch.zeros(len(cells), 4, device=cells.device)
        for box, label in zip(boxes.to(cells.device), labels):
            side = float((box[2:] - box[:2]).max())
            level = next(i for i, (lo, hi) in enumerate(self.size_ranges) if lo <= side < hi)
            at_level = level_of == level
            inside = at_level & (cells > box[:2]).all(1) & (cells < box[2:]).all(1)
            if not inside.any():  # no centre inside the box: the nearest cell of its level
                distance = (cells - (box[:2] + box[2:]) / 2).abs().max(1).values.masked_fill(~at_level, float("inf"))
                inside = torch.zeros_like(inside)
                inside[distance.argmin()] = True
            cls_t[inside] = int(label) + 1
            reg_t[inside] = torch.cat([cells[inside] - box[:2], box[2:] - cells[inside]], 1) / strides[inside, None]
        return cls_t, reg_t

    def _losses(self, cls, reg, cells, level_of, strides, gt_boxes, gt_labels):
        targets = [self._targets(cells, level_of, strides, b, l) for b, l in zip(gt_boxes, gt_labels)]
        cls_t = torch.stack([t[0] for t in targets])
        reg_t = torch.stack([t[1] for t in targets])
        pos = cls_t > 0
        weight = torch.ones(self.num_classes + 1, device=cls.device)
        weight[0] = 0.1  # far more background cells than boxes
        return dict(
            cls_loss=F.cross_entropy(cls.flatten(0, 1), cls_t.flatten(), weight=weight),
            reg_loss=F.smooth_l1_loss(reg[pos], reg_t[pos]),
        )

    def _detections(self, cls, reg, cells, strides):
        results = []
        for probs, r in zip(cls.softmax(-1), reg):
            scores, labels = probs[:, 1:].max(1)
            keep = scores > self.score_thresh
            boxes = torch.cat([cells - r[:, :2] * strides[:, None], cells + r[:, 2:] * strides[:, None]], 1)[keep]
            scores, labels = scores[keep], labels[keep]
            kept = nms(boxes, scores, self.nms_thresh)
            results.append(dict(boxes=boxes[kept], scores=scores[kept], labels=labels[kept]))
        return results


@OBJECT_REGISTRY.register
class DetectionF1(EvalMetric):
    """F1 of the detections against the boxes: a detection is right when its label is and its box
    overlaps an unmatched box of the image by IoU >= ``iou`` (higher scores matched first)."""

    def __init__(self, name="det_f1", iou=0.5):
        super().__init__(name)
        self.iou = iou

    def update(self, batch, detections):
        for det, boxes, labels in zip(detections, batch["gt_boxes"], batch["gt_labels"]):
            free = torch.ones(len(boxes), dtype=torch.bool)
            hits = 0
            for box, label in zip(det["boxes"].cpu(), det["labels"].cpu()):
                ious = box_iou(box[None], boxes)[0].masked_fill(~free | (labels != label), 0)
                if ious.max() >= self.iou:
                    free[ious.argmax()] = False
                    hits += 1
            self.sum_metric += 2 * hits
            self.num_inst += len(det["boxes"]) + len(boxes)
