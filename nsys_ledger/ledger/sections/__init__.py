"""One module per part of an expectations file, each with its reader and its writer side by side.

Every ``read_X(reader, doc, ...)`` takes the parsed TOML and a `LedgerReader` (typed access,
errors with key and line) and returns its part of the `Expectations`; every
``write_X(out, exp)`` adds the same table to a `LedgerWriter`. `nsys_ledger.ledger.document`
calls them in file order:

- `model`     [model]      name, description
- `params`    [params]     parameters (numbers or formulas over each other)
- `steps`     [steps]      how decode steps are found and excluded
- `ops`       [ops.NAME]   kernel-name patterns and GEMM shapes per op
- `counts`    [anchors.OP], [total]   per-step counts (they share one form)
- `timeline`  [gaps], [h2d], [graphs], [ranks]
- `layers`    [layers], [layers.modules], [layers.classes.NAME]
"""
