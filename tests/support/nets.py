"""Small models the tuning tests share (a conv and a dense task, seconds to tune)."""
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 8 * 8, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


class Depthwise(torch.nn.Module):
    """One depthwise conv task (a window: its out_layout knob came after the first
    records were written)."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels)

    def forward(self, x):
        return torch.relu(self.dw(x))


def before_knob(record, knob: str = "out_layout"):
    """`record` as a version before `knob` joined its space wrote it: without that knob."""
    import dataclasses
    return dataclasses.replace(record, config={k: v for k, v in record.config.items()
                                               if k != knob})
