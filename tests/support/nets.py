"""Small models the tuning tests share (a conv and a dense task, seconds to tune)."""
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)
        self.fc = torch.nn.Linear(32 * 8 * 8, 16)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))
