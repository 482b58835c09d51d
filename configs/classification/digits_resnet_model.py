"""The model of ``digits_resnet.py``, registered the way a HAT project registers its own models.

A HAT config names its model by a registered type and imports the module that registers it
(``from my_project.models import MyNet  # noqa: F401``); the config's directory is on
``sys.path`` while it runs, so a module beside it imports by its plain name. This one
specialises hat-ignite's :class:`~hat_ignite.models.ResNetClassifier` for the digits as 16x16
single-channel images: the sizes the config trains are its defaults.
"""

from hat.registry import OBJECT_REGISTRY

from hat_ignite.models import ResNetClassifier


@OBJECT_REGISTRY.register
class DigitsResNet(ResNetClassifier):
    """A conv-BN-ReLU stem and three residual stages (16, 32, 64 channels) for 1x16x16 digits.

    Args:
        num_classes: number of output classes.
        widths: channels of each stage; stages after the first halve the resolution.
        blocks: residual blocks per stage.
    """

    def __init__(self, num_classes: int = 10, widths: tuple = (16, 32, 64), blocks: int = 1) -> None:
        super().__init__(in_channels=1, num_classes=num_classes, stem_channels=widths[0], widths=widths,
                         blocks=blocks)
