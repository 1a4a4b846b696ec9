"""Object detection: NonMaxSuppression."""
from __future__ import annotations

import numpy as np

from ..registry import op


def _corners(boxes, center_point_box):
    """[..., 4] boxes as (y_min, x_min, y_max, x_max)."""
    if center_point_box == 0:
        y1, x1, y2, x2 = np.moveaxis(boxes, -1, 0)
        # any diagonal pair of corners is allowed
        return np.stack([np.minimum(y1, y2), np.minimum(x1, x2),
                         np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)
    if center_point_box == 1:
        xc, yc, w, h = np.moveaxis(boxes, -1, 0)
        return np.stack([yc - h / 2, xc - w / 2, yc + h / 2, xc + w / 2], axis=-1)
    raise ValueError(f"center_point_box must be 0 or 1, got {center_point_box}")


def _iou_matrix(c):
    """Pairwise IoU of (n, 4) corner boxes; 0 where the union is empty."""
    area = (c[:, 2] - c[:, 0]) * (c[:, 3] - c[:, 1])
    lo = np.maximum(c[:, None, :2], c[None, :, :2])
    hi = np.minimum(c[:, None, 2:], c[None, :, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    union = area[:, None] + area[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _select(iou, scores, max_boxes, iou_threshold, score_threshold):
    """Greedy selection for one batch and class: box indices in selection order."""
    candidates = np.argsort(-scores, kind="stable")  # ties: the lower box index first
    if score_threshold is not None:
        candidates = candidates[scores[candidates] >= score_threshold]
    suppressed = np.zeros(scores.shape[0], dtype=bool)
    chosen = []
    for i in candidates:  # inherently sequential: each choice suppresses later candidates
        if len(chosen) >= max_boxes:
            break
        if suppressed[i]:
            continue
        chosen.append(i)
        suppressed |= iou[i] > iou_threshold
    return chosen


@op("NonMaxSuppression", 10)
def non_max_suppression(boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                        score_threshold=None, *, center_point_box=0):
    if boxes.ndim != 3 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must have shape [batches, boxes, 4], got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"scores shape {scores.shape} does not match boxes shape {boxes.shape}")
    max_boxes = 0 if max_output_boxes_per_class is None else int(
        np.asarray(max_output_boxes_per_class).reshape(-1)[0])
    iou_t = 0.0 if iou_threshold is None else float(np.asarray(iou_threshold).reshape(-1)[0])
    score_t = None if score_threshold is None else float(
        np.asarray(score_threshold).reshape(-1)[0])
    if not 0 <= iou_t <= 1:
        raise ValueError(f"iou_threshold must be in [0, 1], got {iou_t}")
    selected = []
    if max_boxes > 0:
        corners = _corners(boxes.astype(np.float64), center_point_box)
        for b in range(boxes.shape[0]):
            iou = _iou_matrix(corners[b])
            for c in range(scores.shape[1]):
                for i in _select(iou, scores[b, c].astype(np.float64), max_boxes, iou_t, score_t):
                    selected.append((b, c, i))
    return np.array(selected, dtype=np.int64).reshape(-1, 3)
