"""Workshop layer: what the hands-on material needs on top of the harness.

- `exercise`: what the step scripts in solutions/ and exercises/ share (flags, the digits, the
  CNN, exact evaluation, the epoch's line, `todo`), and how an exercise is generated from its
  solution; solutions use it as `from harness import workshop; workshop.parse_args(...)`;
- `checker`: `harness check`, which runs an attendee's script on real ranks and judges it;
- `my_exercises`: `harness exercise start 02`, an attendee's own copy of a step in my-exercises/;
- `engines`: ipyparallel MPI engines for the notebooks, started and stopped so that none is left;
- `demo`: `make demo`, every backend on the embedded digits and one comparison table;
- `figures`, `pipeline`, `packing`, `precision`: the notebooks' figures, data-pipeline and
  ranks-per-device studies, and what the precisions do to numbers, memory and speed;
- `lr_study`: notebook 02's runs trained side by side, and what their seeds resolve about each LR rule.

The top layer: it may use every layer below; nothing below imports it.
"""

from ..lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        **{
            name: "exercise"
            for name in (
                "parse_args",
                "digits",
                "Digits",
                "build_model",
                "evaluate",
                "report",
                "todo",
                "TodoNotDone",
                "use_launcher_environment",
                "skip_deepspeed_shm_op",
                "exercise_text",
                "todo_blocks",
            )
        },
        "check_script": "checker",
        "start_exercise": "my_exercises",
        "exercise_steps": "my_exercises",
        "start_engines": "engines",
        "Engines": "engines",
        "run_demo": "demo",
        **{
            name: "figures"
            for name in (
                "accuracy_figure",
                "epoch_loss_figure",
                "equivalence_figure",
                "run_colours",
                "seeds_figure",
                "sharding_figure",
                "padded_evaluation_figure",
                "loading_figure",
                "packing_figure",
            )
        },
        **{
            name: "pipeline"
            for name in (
                "compare_loading",
                "loading_table",
                "measure_loading",
                "padded_evaluation",
                "sample_correctness",
                "write_image_tree",
            )
        },
        **{
            name: "packing"
            for name in ("Packing", "packing_rows", "packing_table", "packings", "run_packing_study", "mps_daemon")
        },
        **{name: "lr_study" for name in ("train_side_by_side", "compare", "verdict", "accepted_rules")},
        **{name: "precision" for name in ("format_rows", "rounding_row", "saved_for_backward", "step_time_ratios")},
    },
)
__all__ = __dir__()
