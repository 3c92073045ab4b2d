"""nn.Module code: super().__init__ and method resolution, @property, @staticmethod,
@classmethod, class attributes, helper methods, inheritance, composition, parameters, buffers."""
import torch
from torch import nn

from corpus import case, rand, x48, x48_t


class Base(nn.Module):
    scale = 2.0

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def act(self, x):
        return torch.relu(x)

    def forward(self, x):
        return self.act(self.lin(x)) * self.scale


@case(x48)
class Derived(Base):
    scale = 3.0

    def act(self, x):
        return torch.tanh(super().act(x))


@case(x48)
class SuperForward(Base):
    def forward(self, x):
        return super().forward(x) + 1


@case(x48)
class SuperExplicit(Base):
    def forward(self, x):
        return super(SuperExplicit, self).forward(x) - Base.act(self, x)


@case(x48)
class WithProperty(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self._k = 3

    @property
    def k(self):
        return self._k * 2

    @property
    def weight_t(self):
        return self.lin.weight.t()

    def forward(self, x):
        return x @ self.weight_t * self.k


@case(x48)
class WithStaticAndClassMethods(nn.Module):
    factor = 0.5

    @staticmethod
    def norm(x):
        return x / (x.abs().sum(-1, keepdim=True) + 1)

    @classmethod
    def scaled(cls, x):
        return x * cls.factor

    def forward(self, x):
        return self.norm(x) + self.scaled(x) + WithStaticAndClassMethods.norm(x)


@case(x48)
class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.arange(8.0))
        self.gain = nn.Parameter(torch.ones(8) * 0.5)

    def forward(self, x):
        return (x + self.offset) * self.gain


@case(x48)
class Composed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = Base()
        self.b = Derived()

    def forward(self, x):
        return self.a(x) + self.b(x)


class Mixin:
    def twice(self, x):
        return x * 2


@case(x48)
class WithMixin(Mixin, nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.twice(self.lin(x))


@case(x48)
class ChildrenAttrs(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.drop = nn.Dropout(0.0)
        self.hidden = 8
        self.act_name = "gelu"

    def forward(self, x):
        x = self.norm(x)
        if self.act_name == "gelu":
            x = nn.functional.gelu(x)
        return self.drop(x) * self.hidden


def _eval(cls):
    def build():
        torch.manual_seed(0)
        return cls().eval()
    return build


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@case(lambda: (rand(2, 3, 8, 8),), build=_eval(Conv))
def conv_bn_eval():
    pass


@case(x48_t)
class ModuleCallsFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8))

    def forward(self, x):
        return nn.functional.linear(x, self.weight).softmax(-1)


@case(x48)
class ParametersIteration(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        return self.b(self.a(x)) + self.a.weight.sum() * 0.01


class Registry:
    activations = {"relu": torch.relu, "sigmoid": torch.sigmoid}


@case(x48)
class ClassAttributeTable(nn.Module):
    def forward(self, x):
        return Registry.activations["relu"](x) + Registry.activations["sigmoid"](x)


@case(x48)
class MethodAsValue(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def branch(self, x):
        return self.lin(x).sin()

    def forward(self, x):
        fns = [self.branch, torch.cos]
        return sum(f(x) for f in fns)


@case(x48)
class DunderAttrs(nn.Module):
    def forward(self, x):
        name = type(self).__name__
        return x * len(name) + isinstance(self, nn.Module)
