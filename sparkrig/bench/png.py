"""A small PNG line-plot writer (zlib and struct only): panels of measured and expected figures,
labelled with a 5x7 bitmap font. Enough for the bench's three plots; no plotting dependency."""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GREY: Color = (200, 200, 200)
BLUE: Color = (31, 97, 180)
ORANGE: Color = (230, 120, 20)

# 5x7 glyphs: 7 rows, each a 5-bit mask (base 32, leftmost column = 16) of the columns inked;
# a character not listed is drawn blank
_GLYPHS = {
    "0": "EHJLPHE", "1": "4C4444E", "2": "EH1248V", "3": "V2421HE", "4": "26AIV22", "5": "VGU11HE",
    "6": "68GUHHE", "7": "V124888", "8": "EHHEHHE", "9": "EHHF12C", "A": "EHHVHHH", "B": "UHHUHHU",
    "C": "EHGGGHE", "D": "SIHHHIS", "E": "VGGUGGV", "F": "VGGUGGG", "G": "EHGNHHF", "H": "HHHVHHH",
    "I": "E44444E", "K": "HIKOKIH", "L": "GGGGGGV", "M": "HRLLHHH", "N": "HHPLJHH", "O": "EHHHHHE",
    "P": "UHHUGGG", "R": "UHHUKIH", "S": "FGGE11U", "T": "V444444", "U": "HHHHHHE", "V": "HHHHHA4",
    "W": "HHHLLLA", "X": "HHA4AHH", "Y": "HHA4444", "Z": "V1248GV", ".": "00000CC", "/": "11248GG",
    "-": "000E000", ":": "0CC0CC0", "(": "2488842", ")": "8422248", "%": "OP248J3", ",": "0000C48",
    "+": "044V440", "=": "00V0V00",
}  # fmt: skip
_ROW = "0123456789ABCDEFGHIJKLMNOPQRSTUV"


class Canvas:
    def __init__(self, width: int, height: int, bg: Color = WHITE) -> None:
        self.w, self.h = width, height
        self.px = [bytearray(bytes(bg) * width) for _ in range(height)]

    def set(self, x: int, y: int, c: Color) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            self.px[y][3 * x : 3 * x + 3] = bytes(c)

    def get(self, x: int, y: int) -> Color:
        r, g, b = self.px[y][3 * x : 3 * x + 3]
        return (r, g, b)

    def rect(self, x0: int, y0: int, x1: int, y1: int, c: Color) -> None:
        for y in range(max(0, y0), min(self.h, y1 + 1)):
            for x in range(max(0, x0), min(self.w, x1 + 1)):
                self.set(x, y, c)

    def line(self, x0: int, y0: int, x1: int, y1: int, c: Color, width: int = 2,
             dash: int = 0) -> None:  # fmt: skip
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            if dash and (i // dash) % 2:
                continue
            x = round(x0 + (x1 - x0) * i / steps)
            y = round(y0 + (y1 - y0) * i / steps)
            self.rect(x - width // 2, y - width // 2, x + (width - 1) // 2, y + (width - 1) // 2, c)

    def text(self, x: int, y: int, s: str, c: Color = BLACK, scale: int = 2) -> int:
        """Draw s (upper-cased) with its top-left at (x, y); return the width drawn."""
        for ch in s.upper():
            for gy, row in enumerate(_GLYPHS.get(ch, "")):
                for gx in range(5):
                    if not _ROW.index(row) >> (4 - gx) & 1:
                        continue
                    self.rect(x + gx * scale, y + gy * scale, x + gx * scale + scale - 1,
                              y + gy * scale + scale - 1, c)  # fmt: skip
            x += 6 * scale
        return len(s) * 6 * scale

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.px)

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.w, self.h, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))  # fmt: skip


def text_width(s: str, scale: int = 2) -> int:
    return len(s) * 6 * scale


@dataclass
class Series:
    label: str
    points: list[tuple[int, float]]  # (x index, y)
    color: Color
    line: bool = True  # False: points only (figures at separate conditions, not a curve)


@dataclass
class Panel:
    title: str
    x_labels: list[str]
    series: list[Series] = field(default_factory=list)
    bands: list[tuple[float, float, str]] = field(default_factory=list)  # expected ranges


def nice_step(v: float) -> float:
    """The smallest of 1, 2, 2.5, 5 (times a power of ten) that is >= v."""
    if v <= 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(v))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= v * (1 - 1e-9))


def fmt(v: float) -> str:
    if v >= 10000:
        return f"{v / 1000:g}K"
    return f"{v:.0f}" if v >= 10 or v == int(v) else f"{v:.2g}"


def draw_panel(cv: Canvas, p: Panel, x0: int, y0: int, w: int, h: int) -> None:
    left, right, top, bottom = x0 + 70, x0 + w - 20, y0 + 40, y0 + h - 50
    cv.text(x0 + (w - text_width(p.title)) // 2, y0 + 10, p.title)
    values = [y for s in p.series for _, y in s.points] + [b for band in p.bands for b in band[:2]]
    step = nice_step(max(values, default=1.0) * 1.05 / 5)
    ticks = max(1, math.ceil(max(values, default=1.0) * 1.05 / step))
    ymax = step * ticks
    for k in range(ticks + 1):  # y grid and ticks
        yv = step * k
        y = bottom - round((bottom - top) * k / ticks)
        cv.line(left, y, right, y, GREY, 1)
        label = fmt(yv)
        cv.text(left - 8 - text_width(label), y - 7, label)
    n = max(1, len(p.x_labels))

    def xpos(i: int) -> int:
        return left + round((right - left) * (i + 0.5) / n)

    def ypos(v: float) -> int:
        return bottom - round((bottom - top) * v / ymax)

    for i, label in enumerate(p.x_labels):
        cv.text(xpos(i) - text_width(label) // 2, bottom + 10, label)
    for lo, hi, _ in p.bands:
        cv.rect(left + 1, ypos(hi), right - 1, ypos(lo), (253, 224, 190))
        cv.line(left, ypos(lo), right, ypos(lo), ORANGE, 2, dash=6)
        cv.line(left, ypos(hi), right, ypos(hi), ORANGE, 2, dash=6)
    cv.line(left, top, left, bottom, BLACK, 2)
    cv.line(left, bottom, right, bottom, BLACK, 2)
    for s in p.series:
        pts = [(xpos(i), ypos(v)) for i, v in sorted(s.points)]
        for (ax, ay), (bx, by) in zip(pts, pts[1:], strict=False):
            if s.line:
                cv.line(ax, ay, bx, by, s.color, 3)
        for x, y in pts:
            r = 4 if s.line else 6
            cv.rect(x - r, y - r, x + r, y + r, s.color)
    # legend
    lx = left + 10
    for s in p.series:
        cv.rect(lx, bottom + 32, lx + 10, bottom + 42, s.color)
        lx += 16 + cv.text(lx + 16, bottom + 31, s.label) + 12
    for _, _, label in p.bands[:1]:
        cv.rect(lx, bottom + 32, lx + 10, bottom + 42, ORANGE)
        cv.text(lx + 16, bottom + 31, label)


def plot(panels: list[Panel], width: int = 520, height: int = 400) -> bytes:
    cv = Canvas(width * len(panels), height)
    for i, p in enumerate(panels):
        draw_panel(cv, p, i * width, 0, width, height)
    return cv.png()


def read_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB bytes) of a PNG this module wrote (filter 0 only)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError(f"bad CRC in {kind!r}")
        if kind == b"IHDR":
            w, h = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = 1 + 3 * w
    return w, h, [raw[r * stride + 1 : (r + 1) * stride] for r in range(h)]
