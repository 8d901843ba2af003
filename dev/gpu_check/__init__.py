"""``make gpu-check``: one prepared run of the GPU paths on a lent GPU machine.

``python -m dev.gpu_check --out DIR [--dry-run] [--budget-s N]`` runs
each step (``steps.STEPS``) as its own subprocess with its own timeout
(``runner``), each writing its raw files and a ``result.json`` under ``DIR/<step>/``,
and rewrites ``DIR/REPORT.md`` after every step (``report``), so a killed run leaves a
partial report. Without a GPU it prints one line and exits 0.

Importable without TensorFlow or pandas: the steps that need them import them inside.
"""
