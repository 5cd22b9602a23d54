"""Draw the worked example's scribble mask: samples/classify/astronaut.scribbles.png.

A few hand-drawn-style strokes (polylines with a small wobble, 5 px wide) on
samples/astronaut.jpg's 512x512 grid, as a user would paint them in an editor:
0 = unlabelled, 1 = background (wall, flag, shuttle), 2 = orange suit, 3 = face and hair.
Also writes samples/classify/astronaut.scribbles.jpg, the strokes drawn on the photo in
the overlay's class colours. Run once from the repository root:
    PYTHONPATH=. python samples/classify/make_scribbles.py
"""

from pathlib import Path

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
STROKES = {
    1: [  # background: wall, flag, shuttle, backdrop
        [(70, 20), (110, 45), (140, 60), (125, 120)],
        [(330, 30), (355, 80), (360, 120), (340, 200)],
        [(12, 150), (30, 200), (40, 250), (22, 330)],
        [(405, 100), (412, 150), (420, 200)],
        [(300, 18), (340, 14), (380, 15)],
        [(470, 60), (480, 140), (470, 230)],
        [(55, 150), (70, 200), (80, 240)],
    ],
    2: [  # the orange suit
        [(60, 300), (85, 340), (100, 380), (90, 460)],
        [(180, 262), (150, 320), (120, 300)],
        [(300, 300), (318, 318), (330, 330)],
        [(250, 440), (262, 462), (270, 480)],
        [(40, 420), (50, 450), (60, 480)],
    ],
    3: [  # face and hair
        [(195, 100), (220, 118), (250, 105)],
        [(200, 72), (225, 70), (250, 75)],
        [(170, 52), (200, 30), (260, 30), (290, 60)],
        [(228, 158), (234, 172)],
    ],
}


def wobble(points, rng):
    """Resample a polyline every 4 px and jitter it a little, like a hand on a mouse."""
    out = []
    for (x0, y0), (x1, y1) in zip(points[:-1], points[1:], strict=True):
        n = max(2, int(np.hypot(x1 - x0, y1 - y0) / 4))
        for t in np.linspace(0, 1, n, endpoint=False):
            out.append((x0 + t * (x1 - x0), y0 + t * (y1 - y0)))
    out.append(points[-1])
    pts = np.array(out, dtype=np.float64)
    pts += np.cumsum(rng.normal(0, 0.6, pts.shape), axis=0) * 0.5
    return np.rint(pts).astype(np.int32)


def main() -> None:
    rng = np.random.default_rng(6)
    mask = np.zeros((512, 512), np.uint8)
    for label, strokes in STROKES.items():
        for stroke in strokes:
            cv2.polylines(mask, [wobble(stroke, rng)], False, label, 5, cv2.LINE_8)
    cv2.imwrite(str(HERE / "astronaut.scribbles.png"), mask, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    # What the strokes look like on the photo (README), in the overlay's class colours.
    from imgfilter.classify import PALETTE

    shown = cv2.imread(str(HERE.parents[1] / "samples" / "astronaut.jpg"))
    shown[mask > 0] = PALETTE[mask[mask > 0] - 1]
    cv2.imwrite(str(HERE / "astronaut.scribbles.jpg"), shown, [cv2.IMWRITE_JPEG_QUALITY, 85])
    print({int(k): int(v) for k, v in zip(*np.unique(mask, return_counts=True), strict=True)})


if __name__ == "__main__":
    main()
