"""The check as a flow of step windows: plan -> window -> merge -> judge.

* `plan`: steps found once from the trace, cut into windows of whole decode steps; every GPU
  activity gets the window that owns it.
* `window`: the per-step stages (gaps with causes, H2D, budget, layers and sequences, time use,
  step kinds) run on one window's activities, with one step of context on each side.
* `run`: the windows one after the other, in local processes (`-j`) or on Dask (`--dask`,
  `dask_cluster`).
* `stream`: plan and windows for an SQLite export too big to hold: its activities read a chunk at
  a time into a store on disk, the steps found from the chunks, each window read back from the
  store (memory follows the chunk and the window, not the trace).
* `merge`: the windows' per-step frames stacked into the frames one whole-trace window gives.
* `judge`: the outcomes, from the merged frames only (also for stacked rank files).
* `multifile` (with `worker`, `dask_cluster`): several exports, one per rank, each checked
  through this flow in a process of its own or on a Dask worker, their results stacked and
  judged again.
"""
