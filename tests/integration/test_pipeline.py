"""Loading measured with data-loader worker processes."""

from __future__ import annotations

import pytest

from harness.training.metrics import OUTSIDE_LOAD_ABOVE
from harness.workshop.pipeline import (
    loading_table,
    measure_loading,
    write_image_tree,
)
from tests.helpers.machine_load import outside_share
from tests.unit.test_pipeline import _compute_over_total
from tests.unit.test_pipeline import image_tree as image_tree  # the fixture: a module-scoped digits tree

# Alone: the loader's contention verdict is compared with the machine's load, which a second lane would raise.
pytestmark = pytest.mark.alone


@pytest.mark.parametrize("source,workers", [("per-sample", 0), ("prepared", 1)])
def test_measure_loading_times_the_steps_it_was_asked_for(image_tree, source, workers):
    measured = measure_loading(
        image_tree[0], source, num_workers=workers, batch_size=16, steps=3, warmup_steps=1, device="cpu"
    )
    assert (measured.source, measured.num_workers, measured.steps, measured.batch_size) == (source, workers, 3, 16)
    assert measured.throughput > 0 and 0 < measured.au <= 1
    assert measured.au == pytest.approx(_compute_over_total(measured))
    assert f"| {source} |" in loading_table([measured])


def test_a_loader_workers_cpu_time_is_the_jobs_own_in_the_contention_verdict(tmp_path):
    """The worker decodes 160-pixel files on the other core, busy for about a quarter of the window's
    CPU time: were its CPU time not read while it lives, it would count as other programs' load and
    flag the row (23% outside load measured so, against 1% when read)."""
    write_image_tree(str(tmp_path), size=160)
    before = outside_share(2.0)
    measured = measure_loading(
        str(tmp_path), "per-sample", num_workers=1, batch_size=64, steps=10, warmup_steps=2, device="cpu"
    )
    after = outside_share(2.0)
    contention = measured.contention
    assert contention["outside_cpu_share"] is not None, contention["nodes"]
    print(f"outside load: {before:.0%} before, {contention['outside_cpu_share']:.0%} in the run, {after:.0%} after")
    assert "1 loader worker(s)" in contention["oversubscription"]
    if max(before, after) < OUTSIDE_LOAD_ABOVE / 2:  # a quiet machine around the run: not flagged
        assert not contention["flagged"], contention
    assert ("FLAGGED" in loading_table([measured])) == contention["flagged"]
