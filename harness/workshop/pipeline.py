"""Measuring the input side of data-parallel training (notebook 04): evaluation with a padding
sampler against the exact one, and per-sample image transforms against prepared arrays.

Evaluation. The workshop scripts evaluate with torch's `DistributedSampler`, which pads the test
set with repeated samples until it divides by the world size, and average the ranks' accuracies.
`padded_evaluation` computes what that reports at any world size from each test sample's
correctness (`sample_correctness`), with torch's own sampler choosing the indices, so it can be
set beside the harness's exact evaluation (every sample once, global sums;
harness.training.evaluate.evaluate).

Loading. `write_image_tree` writes a dataset as one PNG per sample (an ImageNet-style tree, the
form raw data arrives in); `measure_loading` trains the model on it for a few steps either the
textbook way, decoding and transforming every sample in a torchvision `ImageFolder` behind a
`DataLoader`, or the harness's way, from the arrays `harness data prepare` decoded once. Both go
through the same timed loop, so throughput and AU (harness.training.metrics's one definition, with
the compute of each step and the timed steps' elapsed time) compare like with like; `compare_loading` measures several
configurations in interleaved rounds, so that a shared machine's drifting load falls on all alike,
and gives each the contention verdict a record carries, read over its timed steps.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..config import TrainConfig
from ..data import DataOptions, ImageArrays, load_split
from ..errors import UsageError, unknown_choice
from ..training.contention import CpuMeter, own_demand
from ..training.metrics import accelerator_utilisation
from ..training.timing import process_contention

LOADING_SOURCES = ("per-sample", "prepared")
IMAGE_TREE_SPLITS = (("train", "train"), ("test", "val"))  # harness split -> directory of the tree


def sample_correctness(config: TrainConfig, model_file: str) -> np.ndarray:
    """Whether the model in `model_file` classifies each sample of the test split of the config's
    image task correctly (bool per sample, in order), scored in this process."""
    from ..tasks.loading import load_task
    from ..tasks.task import BatchContext
    from ..training.score import load_model_file

    loaded = load_task(config.task, config.task_args)
    model = load_model_file(model_file, loaded.task.build_model(), loaded.label).eval()
    test_set = loaded.task.test_data
    batch = test_set.fetch(np.arange(len(test_set)))
    images, labels = loaded.task.prepare_batch(batch, BatchContext(torch.device("cpu"), training=False))
    with torch.no_grad():
        predicted = model(images).argmax(dim=1)
    return (predicted == labels).numpy()


def padded_indices(num_samples: int, world_size: int, shuffle: bool = True, seed: int = 0) -> np.ndarray:
    """Every rank's test indices under torch's DistributedSampler, rank after rank."""
    from torch.utils.data import DistributedSampler

    dataset = range(num_samples)  # the sampler needs only len()
    return np.concatenate(
        [
            np.fromiter(
                DistributedSampler(
                    dataset,
                    num_replicas=world_size,
                    rank=rank,  # type: ignore[arg-type]
                    shuffle=shuffle,
                    seed=seed,
                ),
                dtype=np.int64,
            )
            for rank in range(world_size)
        ]
    )


@dataclass(frozen=True)
class PaddedEvaluation:
    """What an evaluation with DistributedSampler reports at one world size, beside the truth."""

    world_size: int
    test_samples: int
    samples_scored: int  # world_size x ceil(test_samples / world_size)
    duplicates: int  # samples scored twice
    padded_accuracy: float  # mean of the ranks' accuracies (equal shards): correct among the scored
    exact_accuracy: float  # every sample once

    @property
    def accuracy_error(self) -> float:
        """padded - exact, in accuracy points (fraction)."""
        return self.padded_accuracy - self.exact_accuracy

    @property
    def standard_error(self) -> float:
        """The exact accuracy's own standard error over this test set, sqrt(p (1 - p) / n) (fraction):
        how far another test set of the same size would typically move it."""
        return math.sqrt(self.exact_accuracy * (1 - self.exact_accuracy) / self.test_samples)


def padded_evaluation(correct: np.ndarray, world_size: int, shuffle: bool = True, seed: int = 0) -> PaddedEvaluation:
    """The accuracy a DistributedSampler evaluation reports at `world_size` ranks, from each test
    sample's correctness. Its shards are equally long, so the mean of the ranks' accuracies equals
    the accuracy over all the samples scored, duplicates included."""
    if world_size < 1:
        raise UsageError(f"world_size must be a positive integer, got {world_size}")
    indices = padded_indices(len(correct), world_size, shuffle, seed)
    return PaddedEvaluation(
        world_size,
        len(correct),
        len(indices),
        len(indices) - len(np.unique(indices)),
        float(correct[indices].mean()),
        float(correct.mean()),
    )


# -- per-sample image files against prepared arrays -------------------------------------------------


def write_image_tree(data_dir: str, dataset: str = "digits", size: Optional[int] = None) -> dict[str, int]:
    """Write `dataset` (an embedded one) as PNG files, DATA_DIR/train/<class>/<n>.png and
    DATA_DIR/val/<class>/<n>.png, the layout of `--dataset imagefolder`; the images written per split.

    `size`: the side of the written images in pixels (default: the dataset's own). Photos arrive
    larger than the network's input (ImageNet's are resized to 224 and smaller); writing the
    images larger gives each per-sample decode and resize what it costs for such files."""
    from PIL import Image

    if os.path.isdir(os.path.join(data_dir, "train")):
        raise UsageError(f"{data_dir}/train exists already; write the image tree into an empty directory")
    if size is not None and size < 1:
        raise UsageError(f"size must be a positive number of pixels, got {size}")
    written = {}
    for split, folder in IMAGE_TREE_SPLITS:
        arrays = load_split(dataset, split, DataOptions(data_dir, "cnn", 0, 60.0))
        for index in range(len(arrays)):
            image, label = arrays.images[index], int(arrays.labels[index])
            directory = os.path.join(data_dir, folder, str(label))
            os.makedirs(directory, exist_ok=True)
            mode = "L" if image.shape[0] == 1 else "RGB"
            picture = Image.fromarray(image[0] if mode == "L" else image.transpose(1, 2, 0), mode)
            if size is not None and size != picture.width:
                picture = picture.resize((size, size), Image.Resampling.BILINEAR)
            # Fast compression: written once here, decoded at every epoch by the per-sample pipeline.
            picture.save(os.path.join(directory, f"{index:05d}.png"), compress_level=1)
        written[split] = len(arrays)
    return written


@dataclass(frozen=True)
class LoadingMeasurement:
    """One loading configuration trained for a few steps: where the time went."""

    source: str  # "per-sample" (ImageFolder + transforms per sample) or "prepared" (arrays, whole batches)
    num_workers: int
    prefetch: int
    batch_size: int
    steps: int  # timed steps
    throughput: float  # samples/s over the timed steps
    au: float  # harness.training.metrics.accelerator_utilisation(compute, elapsed)
    data_wait_ms: float  # per step
    compute_ms: float  # per step: forward, backward, optimizer
    # One value per interleaved round, in round order: what harness.study.scaling.intervals pairs configurations by.
    round_throughputs: tuple[float, ...] = ()
    round_data_wait_ms: tuple[float, ...] = ()
    round_compute_ms: tuple[float, ...] = ()
    # harness.training.metrics's contention verdict over the timed windows of every round (the
    # section a record carries): whether other programs used the cores while this configuration ran.
    contention: Optional[dict[str, Any]] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _per_sample_batches(
    data_dir: str, image_size: int, arrays: ImageArrays, batch_size: int, num_workers: int, prefetch: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The textbook pipeline: every sample opened, decoded, resized and normalised on its own."""
    from torch.utils.data import DataLoader, RandomSampler
    from torchvision import datasets, transforms

    transform = transforms.Compose(
        [
            transforms.Resize(image_size),
            transforms.CenterCrop(image_size),
            transforms.ToTensor(),
            transforms.Normalize(arrays.mean, arrays.std),
        ]
    )
    images = datasets.ImageFolder(os.path.join(data_dir, "train"), transform=transform)
    sampler = RandomSampler(images, generator=torch.Generator().manual_seed(seed))
    extra = {"prefetch_factor": prefetch, "persistent_workers": False} if num_workers else {}
    while True:  # epochs, until the caller has its steps
        yield from DataLoader(
            images, batch_size=batch_size, sampler=sampler, num_workers=num_workers, drop_last=True, **extra
        )


def _prepared_batches(
    arrays: ImageArrays, batch_size: int, num_workers: int, prefetch: int, seed: int, steps: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The harness's pipeline: one index into the uint8 array per batch, one normalisation per batch."""
    from ..data.loader import iterate_batches
    from ..data.sharding import RankSchedule

    normalise = arrays.normaliser(torch.device("cpu"))
    schedule = RankSchedule(len(arrays), 1, 0, batch_size, seed, steps)
    for images, labels in iterate_batches(arrays, schedule, num_workers, False, prefetch):
        yield normalise(images), labels


def measure_loading(
    data_dir: str,
    source: str,
    num_workers: int = 0,
    prefetch: int = 2,
    batch_size: int = 64,
    steps: int = 30,
    warmup_steps: int = 5,
    image_size: int = 28,
    threads: int = 1,
    seed: int = 0,
    device: str = "auto",
) -> LoadingMeasurement:
    """Train the workshop CNN for `warmup_steps` + `steps` steps on the image tree in `data_dir`
    (write_image_tree), fed by `source`; time the last `steps`. `threads` torch threads compute
    (on the CPU); `num_workers` loader processes prefetch `prefetch` batches each. Runs in this
    process, on GPU 0 when there is one (device "auto"), else on the CPU."""
    return compare_loading(
        data_dir,
        [(source, num_workers)],
        rounds=1,
        prefetch=prefetch,
        batch_size=batch_size,
        steps=steps,
        warmup_steps=warmup_steps,
        image_size=image_size,
        threads=threads,
        seed=seed,
        device=device,
    )[0]


def _check_comparison(configurations: Sequence[tuple[str, int]], rounds: int, steps: int) -> None:
    """UsageError for a comparison that cannot run: no rounds or steps, a configuration twice, an unknown source."""
    if rounds < 1 or steps < 1:
        raise UsageError(f"rounds and steps must be positive, got {rounds} and {steps}")
    if len(set(configurations)) != len(configurations):
        raise UsageError(f"each (source, workers) once, got {list(configurations)}")
    for source, _ in configurations:
        if source not in LOADING_SOURCES:
            raise unknown_choice("loading source", source, LOADING_SOURCES)


def compare_loading(
    data_dir: str,
    configurations: Sequence[tuple[str, int]],
    rounds: int = 3,
    prefetch: int = 2,
    batch_size: int = 64,
    steps: int = 10,
    warmup_steps: int = 3,
    image_size: int = 28,
    threads: int = 1,
    seed: int = 0,
    device: str = "auto",
) -> list[LoadingMeasurement]:
    """measure_loading for every (source, num_workers) of `configurations`, `rounds` times
    interleaved (each configuration once, then all again), `steps` timed steps a round; each
    configuration's rounds add up to one measurement, in the order given.

    Interleaving lays the load of other programs on every configuration alike: on a busy machine
    compute times drift by a factor of two within a minute, which one measurement after the other
    would read as a difference between the configurations."""
    _check_comparison(configurations, rounds, steps)
    # The prepared arrays (decoded once by `harness data prepare`, here on first use) give the
    # normalisation statistics to both sources, so both feed the model the same numbers.
    arrays = load_split("imagefolder", "train", DataOptions(data_dir, "cnn", image_size, 600.0))
    target = torch.device(
        "cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device
    )
    # per configuration, per round: data wait, compute, elapsed (s); and its CPU meter over every round
    totals: dict[tuple[str, int], list[np.ndarray]] = {configuration: [] for configuration in configurations}
    meters = {
        (source, workers): CpuMeter(threads, own_demand(threads, (), workers)) for source, workers in configurations
    }
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(rounds):
            for source, workers in configurations:
                batches = (
                    _per_sample_batches(data_dir, image_size, arrays, batch_size, workers, prefetch, seed)
                    if source == "per-sample"
                    else _prepared_batches(arrays, batch_size, workers, prefetch, seed, warmup_steps + steps)
                )
                totals[source, workers].append(
                    _timed_steps(
                        batches, arrays, image_size, target, warmup_steps, steps, seed, meters[source, workers]
                    )
                )
    finally:
        torch.set_num_threads(previous_threads)
    return [
        _measurement(source, workers, prefetch, batch_size, steps, np.array(per_round), meters[source, workers])
        for (source, workers), per_round in totals.items()
    ]


def _measurement(
    source: str, workers: int, prefetch: int, batch_size: int, steps: int, per_round: np.ndarray, meter: CpuMeter
) -> LoadingMeasurement:
    """One configuration's rounds (rows: data wait, compute, elapsed seconds) added up, and each kept;
    its contention verdict from `meter`, which read the CPU over those rounds."""
    waited, computed, elapsed = per_round.sum(axis=0)
    timed = len(per_round) * steps
    return LoadingMeasurement(
        source,
        workers,
        prefetch,
        batch_size,
        timed,
        timed * batch_size / elapsed,
        accelerator_utilisation(computed, elapsed),
        1000 * waited / timed,
        1000 * computed / timed,
        tuple(float(steps * batch_size / row[2]) for row in per_round),
        tuple(float(1000 * row[0] / steps) for row in per_round),
        tuple(float(1000 * row[1] / steps) for row in per_round),
        process_contention(meter),
    )


def _timed_steps(
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    arrays: ImageArrays,
    image_size: int,
    target: torch.device,
    warmup_steps: int,
    steps: int,
    seed: int,
    meter: CpuMeter,
) -> np.ndarray:
    """Train a fresh workshop CNN for `warmup_steps` + `steps` steps from `batches`, then close them;
    the data wait, compute and elapsed seconds of the last `steps`. `meter` reads the CPU over the
    timed steps: it opens after the warmup and closes before the loader's workers stop, so that
    their CPU time is read while they live and counts as the job's own."""
    from ..tasks.models import build_model
    from ..training.timing import device_waiter

    finish = device_waiter(target)  # a GPU step is done when the device says so
    torch.manual_seed(seed)
    model = build_model("cnn", arrays.shape[0], image_size, arrays.num_classes).to(target)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    waited = computed = 0.0
    try:
        started = time.perf_counter()
        for step in range(warmup_steps + steps):
            if step == warmup_steps:  # worker start-up and first allocations left out
                waited = computed = 0.0
                meter.open()
                started = time.perf_counter()
            before = time.perf_counter()
            images, labels = next(batches)
            images, labels = images.to(target), labels.to(target)
            finish()
            ready = time.perf_counter()
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            finish()
            done = time.perf_counter()
            waited += ready - before
            computed += done - ready
        elapsed = time.perf_counter() - started
        meter.close()
    finally:
        batches.close()  # stops the loader's workers
    return np.array([waited, computed, elapsed])


def loading_table(measurements: list[LoadingMeasurement]) -> str:
    """Markdown: one row per measurement, throughput relative to the first row."""
    from ..study.scaling.report import markdown_table

    first = measurements[0].throughput if measurements else math.nan
    return markdown_table(
        [m.as_dict() for m in measurements],
        (
            ("source", lambda r: r["source"]),
            ("loader workers", lambda r: r["num_workers"]),
            ("prefetch", lambda r: r["prefetch"] if r["num_workers"] else None),
            ("samples/s", lambda r: r["throughput"]),
            ("vs first row", lambda r: r["throughput"] / first),
            ("AU", lambda r: r["au"]),
            ("data wait ms/step", lambda r: r["data_wait_ms"]),
            ("compute ms/step", lambda r: r["compute_ms"]),
            ("outside load", lambda r: _outside_load(r["contention"])),
        ),
    )


def _outside_load(contention: Optional[dict[str, Any]]) -> str:
    """A row's contention verdict in a few words: the share other programs used, and the flag."""
    share = None if contention is None else contention["outside_cpu_share"]
    if share is None:
        return "not measured"
    return f"{share:.0%}" + (" FLAGGED" if contention["flagged"] else "")
