"""The status widget's text against JupyterLab's own theme variables: WCAG contrast >= 4.5 in light and dark.

Reads the installed themes' CSS (no browser): each `color: var(--jp-…, fallback)` of status.css is resolved in
both themes and composited over the notebook background (`--jp-layout-color0`); the fallbacks against white.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlx_jupyter.widgets import status

CSS = Path(status.__file__).with_name("status.css").read_text()
NAMED = {"white": "#ffffff", "black": "#000000"}


def theme_vars(theme: str) -> dict[str, str]:
    jupyterlab = pytest.importorskip("jupyterlab")
    path = Path(jupyterlab.__file__).parent / "themes" / "@jupyterlab" / f"theme-{theme}-extension" / "index.css"
    if not path.exists():
        pytest.skip(f"JupyterLab's {theme} theme is not installed ({path})")
    return dict(re.findall(r"(--[\w-]+):([^;}]+)", path.read_text()))


def resolve(value: str, variables: dict[str, str]) -> str:
    """Follow `var(--x, fallback)` through the theme's variables."""
    m = re.fullmatch(r"\s*var\((--[\w-]+)\s*(?:,\s*(.*))?\)\s*", value)
    if not m:
        return value.strip()
    if m.group(1) in variables:
        return resolve(variables[m.group(1)], variables)
    assert m.group(2) is not None, f"{m.group(1)} is not defined and has no fallback"
    return resolve(m.group(2), variables)


def rgba(text: str) -> tuple[float, float, float, float]:
    text = NAMED.get(text.strip(), text.strip())
    if text.startswith("#"):
        h = text[1:]
        h = "".join(c * 2 for c in h) if len(h) == 3 else h
        return (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16), 1.0)
    n = [float(x) for x in re.findall(r"[\d.]+", text)]
    assert text.startswith("rgb") and len(n) >= 3, f"not a colour: {text!r}"
    return (n[0], n[1], n[2], n[3] if len(n) > 3 else 1.0)


def luminance(c: tuple[float, ...]) -> float:
    def channel(x: float) -> float:
        x /= 255
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4
    return 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2])


def contrast(fg: str, bg: str) -> float:
    f, b = rgba(fg), rgba(bg)
    a = f[3]
    flat = tuple(f[i] * a + b[i] * (1 - a) for i in range(3))
    hi, lo = sorted([luminance(flat), luminance(b)], reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def text_colours() -> list[str]:
    """Every `color:` value of status.css (text, not borders)."""
    return [v.strip() for v in re.findall(r"(?<![-\w])color:\s*([^;}]+)", CSS)]


def test_every_text_colour_is_a_theme_variable():
    assert text_colours(), "status.css sets no text colour"
    for value in text_colours():
        assert value.startswith("var(--jp-"), f"status.css: {value} is not a JupyterLab theme variable"
    assert "#334155" not in CSS  # the old fixed slate, unreadable on the dark theme


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_text_contrast_in_theme(theme):
    variables = theme_vars(theme)
    bg = resolve(variables["--jp-layout-color0"], variables)
    for value in text_colours():
        ratio = contrast(resolve(value, variables), bg)
        assert ratio >= 4.5, f"{theme} theme: {value} on {bg} has contrast {ratio:.2f} < 4.5"


def test_fallbacks_readable_on_white():
    for value in text_colours():
        fallback = re.fullmatch(r"var\(--[\w-]+\s*,\s*(.*)\)", value)
        assert fallback, value
        if fallback.group(1).strip() != "inherit":
            ratio = contrast(fallback.group(1), "#ffffff")
            assert ratio >= 4.5, f"fallback {fallback.group(1)} on white: {ratio:.2f}"
