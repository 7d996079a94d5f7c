"""The training run and its in-loop pieces: loop, step, engine, schedule, metrics, guards, callback runner, plots."""
