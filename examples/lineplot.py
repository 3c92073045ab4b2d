"""Line plots written as PNG files: through matplotlib when it imports, else through a small
rasterizer of our own (zlib + struct; a 5x7 bitmap font for the labels), so the examples can
always leave a picture behind, also on machines without matplotlib.

    plot_lines(path, {"eager": [...], "kiln": [...]}, title="loss", xlabel="step")
"""
from __future__ import annotations

import math
import struct
import zlib

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]


def plot_lines(path: str, series: dict, title: str = "", xlabel: str = "step", ylabel: str = "",
               use_matplotlib: bool = True) -> str:
    """Plot each named list of y values against its index; returns which writer made the PNG."""
    if use_matplotlib:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception:  # noqa: BLE001 - not installed or unusable: our own writer
            pass
        else:
            fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
            for i, (name, ys) in enumerate(series.items()):
                ax.plot(range(1, len(ys) + 1), ys, label=name,
                        linestyle="-" if i == 0 else "--", color=tuple(c / 255 for c in COLORS[i % 4]))
            ax.set_title(title)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.legend()
            ax.grid(alpha=0.3)
            fig.tight_layout()
            fig.savefig(path)
            plt.close(fig)
            return "matplotlib"
    canvas = Canvas(640, 400)
    _draw_plot(canvas, series, title, xlabel, ylabel)
    canvas.save(path)
    return "builtin"


# ---------------------------------------------------------------------------- the fallback writer
class Canvas:
    """An RGB raster with lines, rectangles and 5x7 text; saved as an 8-bit RGB PNG."""

    def __init__(self, width: int, height: int, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(color)

    def rect(self, x0, y0, x1, y1, color):
        for y in range(max(0, y0), min(self.height, y1 + 1)):
            for x in range(max(0, x0), min(self.width, x1 + 1)):
                self.set(x, y, color)

    def line(self, x0, y0, x1, y1, color, width=1, dash=0):
        """Bresenham, thickened to ``width`` pixels; ``dash`` > 0 leaves gaps of that length."""
        x0, y0, x1, y1 = round(x0), round(y0), round(x1), round(y1)
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err, step = dx + dy, 0
        while True:
            if not dash or (step // dash) % 2 == 0:
                for ox in range(-(width // 2), width - width // 2):
                    for oy in range(-(width // 2), width - width // 2):
                        self.set(x0 + ox, y0 + oy, color)
            step += 1
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, color=(0, 0, 0), scale=1):
        for ch in s:
            rows = FONT.get(ch.lower(), FONT["?"])
            for r, bits in enumerate(rows):
                for c in range(5):
                    if bits >> (4 - c) & 1:
                        self.rect(x + c * scale, y + r * scale, x + c * scale + scale - 1,
                                  y + r * scale + scale - 1, color)
            x += 6 * scale

    def save(self, path: str):
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        with open(path, "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
                    + chunk(b"IEND", b""))


def _ticks(lo: float, hi: float, n: int = 5) -> list:
    span = hi - lo or 1.0
    step = 10 ** math.floor(math.log10(span / n))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= n:
            step *= m
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _label(v: float) -> str:
    return f"{v:.4g}"


def _draw_plot(cv: Canvas, series: dict, title: str, xlabel: str, ylabel: str):
    left, right, top, bottom = 70, cv.width - 20, 40, cv.height - 50
    values = [v for ys in series.values() for v in ys if math.isfinite(v)]
    n = max((len(ys) for ys in series.values()), default=1)
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-12:
        lo, hi = lo - 0.5, hi + 0.5
    pad = 0.05 * (hi - lo)
    lo, hi = lo - pad, hi + pad
    xmax = max(n, 2)

    def px(i):
        return left + (i - 1) / (xmax - 1) * (right - left)

    def py(v):
        return bottom - (v - lo) / (hi - lo) * (bottom - top)

    grey, black = (225, 225, 225), (0, 0, 0)
    for t in _ticks(lo, hi):
        y = round(py(t))
        cv.line(left, y, right, y, grey)
        lab = _label(t)
        cv.text(left - 6 - 6 * len(lab), y - 3, lab)
    for t in _ticks(1, xmax):
        if t < 1:
            continue
        x = round(px(t))
        cv.line(x, top, x, bottom, grey)
        lab = _label(t)
        cv.text(x - 3 * len(lab), bottom + 6, lab)
    cv.line(left, bottom, right, bottom, black)
    cv.line(left, top, left, bottom, black)
    cv.text((left + right) // 2 - 3 * len(xlabel), cv.height - 20, xlabel)
    cv.text(8, top - 20, ylabel)
    cv.text((left + right) // 2 - 6 * len(title), 10, title, scale=2)
    for k, (name, ys) in enumerate(series.items()):
        color = COLORS[k % len(COLORS)]
        pts = [(px(i + 1), py(v)) for i, v in enumerate(ys) if math.isfinite(v)]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            cv.line(x0, y0, x1, y1, color, width=2, dash=0 if k == 0 else 6)
        ly = top + 8 + 14 * k  # legend, top right
        cv.line(right - 110, ly + 3, right - 80, ly + 3, color, width=2, dash=0 if k == 0 else 6)
        cv.text(right - 72, ly, name)


# 5x7 glyphs, one row per int (5 bits, most significant on the left)
FONT = {
    " ": [0, 0, 0, 0, 0, 0, 0], "?": [14, 17, 1, 2, 4, 0, 4], ".": [0, 0, 0, 0, 0, 12, 12],
    "-": [0, 0, 0, 31, 0, 0, 0], "+": [0, 4, 4, 31, 4, 4, 0], "/": [1, 1, 2, 4, 8, 16, 16],
    "(": [2, 4, 8, 8, 8, 4, 2], ")": [8, 4, 2, 2, 2, 4, 8], ":": [0, 12, 12, 0, 12, 12, 0],
    ",": [0, 0, 0, 0, 12, 4, 8], "_": [0, 0, 0, 0, 0, 0, 31], "=": [0, 0, 31, 0, 31, 0, 0],
    "0": [14, 17, 19, 21, 25, 17, 14], "1": [4, 12, 4, 4, 4, 4, 14], "2": [14, 17, 1, 2, 4, 8, 31],
    "3": [31, 2, 4, 2, 1, 17, 14], "4": [2, 6, 10, 18, 31, 2, 2], "5": [31, 16, 30, 1, 1, 17, 14],
    "6": [6, 8, 16, 30, 17, 17, 14], "7": [31, 1, 2, 4, 8, 8, 8], "8": [14, 17, 17, 14, 17, 17, 14],
    "9": [14, 17, 17, 15, 1, 2, 12],
    "a": [14, 17, 17, 31, 17, 17, 17], "b": [30, 17, 17, 30, 17, 17, 30], "c": [14, 17, 16, 16, 16, 17, 14],
    "d": [28, 18, 17, 17, 17, 18, 28], "e": [31, 16, 16, 30, 16, 16, 31], "f": [31, 16, 16, 30, 16, 16, 16],
    "g": [14, 17, 16, 23, 17, 17, 15], "h": [17, 17, 17, 31, 17, 17, 17], "i": [14, 4, 4, 4, 4, 4, 14],
    "j": [7, 2, 2, 2, 2, 18, 12], "k": [17, 18, 20, 24, 20, 18, 17], "l": [16, 16, 16, 16, 16, 16, 31],
    "m": [17, 27, 21, 21, 17, 17, 17], "n": [17, 17, 25, 21, 19, 17, 17], "o": [14, 17, 17, 17, 17, 17, 14],
    "p": [30, 17, 17, 30, 16, 16, 16], "q": [14, 17, 17, 17, 21, 18, 13], "r": [30, 17, 17, 30, 20, 18, 17],
    "s": [15, 16, 16, 14, 1, 1, 30], "t": [31, 4, 4, 4, 4, 4, 4], "u": [17, 17, 17, 17, 17, 17, 14],
    "v": [17, 17, 17, 17, 17, 10, 4], "w": [17, 17, 17, 21, 21, 21, 10], "x": [17, 17, 10, 4, 10, 17, 17],
    "y": [17, 17, 17, 10, 4, 4, 4], "z": [31, 1, 2, 4, 8, 16, 31],
}


def read_png_size(path: str) -> tuple:
    """(width, height) from a PNG's IHDR chunk; raises ValueError for anything else."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError(f"{path} is not a PNG file")
    return struct.unpack(">II", head[16:24])
