"""Loading measured with data-loader worker processes."""

from __future__ import annotations

import pytest

from harness.workshop.pipeline import (
    loading_table,
    measure_loading,
)
from tests.unit.test_pipeline import _compute_over_total
from tests.unit.test_pipeline import image_tree as image_tree  # the fixture: a module-scoped digits tree


@pytest.mark.parametrize("source,workers", [("per-sample", 0), ("prepared", 1)])
def test_measure_loading_times_the_steps_it_was_asked_for(image_tree, source, workers):
    measured = measure_loading(
        image_tree[0], source, num_workers=workers, batch_size=16, steps=3, warmup_steps=1, device="cpu"
    )
    assert (measured.source, measured.num_workers, measured.steps, measured.batch_size) == (source, workers, 3, 16)
    assert measured.throughput > 0 and 0 < measured.au <= 1
    assert measured.au == pytest.approx(_compute_over_total(measured))
    assert f"| {source} |" in loading_table([measured])
