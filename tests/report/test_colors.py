"""Kernel classes keep one colour each, never shared (the kernel figure once gave dequantize and softmax one)."""

from __future__ import annotations

from tunecost.profile.kernels import KERNEL_CLASSES
from tunecost.report.colors import KERNEL_CLASS_COLORS, kernel_colors


def test_every_kernel_class_has_its_own_colour() -> None:
    assert set(KERNEL_CLASS_COLORS) == set(KERNEL_CLASSES)
    assert len(set(KERNEL_CLASS_COLORS.values())) == len(KERNEL_CLASSES)


def test_a_class_keeps_its_colour_whatever_else_is_shown() -> None:
    alone = kernel_colors(["softmax"])
    together = kernel_colors(["dequantize", "softmax", "elementwise", "topk"])
    assert alone["softmax"] == together["softmax"] == KERNEL_CLASS_COLORS["softmax"]
    assert len(set(together.values())) == 4


def test_unknown_classes_take_unused_colours() -> None:
    colors = kernel_colors([*KERNEL_CLASSES, "old_class_a", "old_class_b"])
    assert len(set(colors.values())) == len(KERNEL_CLASSES) + 2
