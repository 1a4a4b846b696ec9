"""NonMaxSuppression: ties, box formats, thresholds, limits."""
import numpy as np
import pytest

from tests.reference.oneop import run_node


def nms(boxes, scores, max_out=None, iou=None, score=None, opset=11, **attrs):
    inputs = [np.asarray(boxes, np.float32), np.asarray(scores, np.float32)]
    inputs += [None if max_out is None else np.array([max_out], np.int64),
               None if iou is None else np.array([iou], np.float32),
               None if score is None else np.array([score], np.float32)]
    y = run_node("NonMaxSuppression", *inputs, opset=opset, **attrs)
    assert y.dtype == np.int64 and y.ndim == 2 and y.shape[1] == 3
    return y.tolist()


# three unit boxes: 0 and 1 overlap with IoU 1/3 (shifted by half), 2 is far away
BOXES = [[[0, 0, 1, 1], [0, 0.5, 1, 1.5], [5, 5, 6, 6]]]


def test_equal_scores_keep_the_lower_index_first():
    assert nms(BOXES, [[[0.5, 0.5, 0.5]]], 10, 0.2) == [[0, 0, 0], [0, 0, 2]]
    # without overlap suppression every box survives, in index order
    assert nms(BOXES, [[[0.5, 0.5, 0.5]]], 10, 0.5) == [[0, 0, 0], [0, 0, 1], [0, 0, 2]]


def test_iou_equal_to_threshold_is_kept():
    # IoU = 1 / 2 exactly: the smaller box lies inside the larger one
    boxes = [[[0, 0, 1, 1], [0, 0, 1, 2]]]
    assert nms(boxes, [[[0.9, 0.8]]], 5, 0.5) == [[0, 0, 0], [0, 0, 1]]
    assert nms(boxes, [[[0.9, 0.8]]], 5, 0.49) == [[0, 0, 0]]


def test_score_order_and_limit():
    scores = [[[0.1, 0.9, 0.5]]]
    assert nms(BOXES, scores, 10, 0.2) == [[0, 0, 1], [0, 0, 2]]
    assert nms(BOXES, scores, 1, 0.2) == [[0, 0, 1]]
    assert nms(BOXES, scores, 10, 0.9) == [[0, 0, 1], [0, 0, 2], [0, 0, 0]]


def test_score_threshold_removes_lower_scores():
    scores = [[[0.1, 0.9, 0.5]]]
    assert nms(BOXES, scores, 10, 0.9, 0.5) == [[0, 0, 1], [0, 0, 2]]  # 0.5 is kept
    assert nms(BOXES, scores, 10, 0.9, 0.95) == []


def test_no_max_output_means_nothing_selected():
    y = nms(BOXES, [[[0.1, 0.9, 0.5]]])
    assert y == []


def test_flipped_corners_and_center_format_agree():
    flipped = [[[1, 1, 0, 0], [1, 1.5, 0, 0.5], [6, 6, 5, 5]]]
    # center format: [x_center, y_center, width, height]
    center = [[[0.5, 0.5, 1, 1], [1.0, 0.5, 1, 1], [5.5, 5.5, 1, 1]]]
    scores = [[[0.3, 0.9, 0.5]]]
    expected = nms(BOXES, scores, 10, 0.3)
    assert expected == [[0, 0, 1], [0, 0, 2]]
    assert nms(flipped, scores, 10, 0.3) == expected
    assert nms(center, scores, 10, 0.3, center_point_box=1) == expected


def test_batches_and_classes_are_independent():
    boxes = BOXES * 2
    scores = [[[0.9, 0.8, 0.1], [0.1, 0.8, 0.9]], [[0.2, 0.3, 0.4], [0.0, 0.0, 0.0]]]
    y = nms(boxes, scores, 2, 0.2, opset=10)
    assert y == [[0, 0, 0], [0, 0, 2], [0, 1, 2], [0, 1, 1],
                 [1, 0, 2], [1, 0, 1], [1, 1, 0], [1, 1, 2]]


def test_bad_shapes_are_rejected():
    with pytest.raises(Exception, match="scores"):
        nms(BOXES, [[[0.1, 0.2]]], 1)
