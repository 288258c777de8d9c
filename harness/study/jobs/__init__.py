"""Site jobs: a whole scaling study as one batch job at a site (`harness study`): the site's profile,
the checks before the queue, submission, the scheduler's view, the job directory, the night-before
smoke run and `harness doctor`."""
