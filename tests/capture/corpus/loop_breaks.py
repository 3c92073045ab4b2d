"""Graph breaks inside for loops, resumed inside the loop (capture/resume_loops.py): a range
loop, a ModuleList, zip/enumerate, nested loops, a list grown across breaks. ``graphs`` and
``breaks`` count compiles: one entry of the loop's resume function serves every iteration its
guards accept, and the second call compiles nothing (``compiles`` is the first call's)."""
import torch
from torch import nn

import kiln
from corpus import case, x48, xy48


@case(x48, graphs=3, breaks=2)  # the frame; the resume function with items left, and without
def range_loop_with_a_break(x):
    x = x * 2
    for _ in range(5):
        x = x.sin() + 1
        kiln.graph_break()
    return x - 1


@case(x48, graphs=3, breaks=2)
class ModuleListWithABreak(nn.Module):  # the layers share one entry (modules guarded by type), then the end
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
            kiln.graph_break()
            x = torch.relu(x)
        return x


@case(xy48, graphs=4, breaks=3)  # the index is read after the break: 1, then symbolic, then the end
def enumerate_zip_with_a_break(x, y):
    for i, (a, b) in enumerate(zip([x, y, x], [y, y, x])):
        x = x + a * b
        kiln.graph_break()
        x = x * i
    return x


@case(x48, graphs=4, breaks=3)  # inner loop resumes (items left / none), outer's last
def nested_loops_with_a_break(x):
    for _ in range(2):
        for _ in range(3):
            x = x * 0.5
            kiln.graph_break()
        x = x + 1
    return x


@case(x48, graphs=5, breaks=4, compiles=5)  # the list grows: one entry per length
def list_grown_across_breaks(x):
    feats = []
    for i in range(4):
        feats.append(x[:, i::4] * 2)
        kiln.graph_break()
    return torch.cat(feats, dim=1)
