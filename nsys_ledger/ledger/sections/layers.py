"""[layers]: how kernels get their layer, and what each class of layers launches.

- ``[layers]``: the NVTX regex, the ops that open and close a layer (layer inference),
  ``uniform``;
- ``[layers.modules]``: NVTX sub-module -> ledger groups;
- ``[layers.classes.NAME]``: the layers of a class (LAYERS, see the package docstring), its
  launches per layer per group, and optionally its kernel `sequence` in issue order (entries
  ``"op"``, ``"op 0-1"``, ``"op|alternative 1-2"``), with `insert_before` for a class whose
  sequence runs inside another class's (the indexer inside the attention).
"""

from __future__ import annotations

import re
from typing import Any

from nsys_ledger.ledger.model import Expectations, LayerClass, LayerRule, OpDef, Range, SequenceEntry
from nsys_ledger.ledger.reading import NAME, LedgerReader, short_list, shown, type_name
from nsys_ledger.ledger.writing import LedgerWriter, Literal, range_value, regex_string

LAYER_RULE_OPS = ("first_opening_op", "opening_followed_by", "closing_op")
LAYERS_KEYS = ("regex", "opening_op", *LAYER_RULE_OPS, "uniform", "modules", "classes")
CLASS_KEYS = ("layers", "groups", "count", "sequence", "insert_before")
# a sequence entry: ops separated by `|`, then an optional count "n" or "a-b"
_SEQUENCE_ENTRY = re.compile(r"^\s*([A-Za-z0-9_\-]+(?:\s*\|\s*[A-Za-z0-9_\-]+)*)\s*(?:(\d+)\s*(?:-\s*(\d+))?)?\s*$")
# the most kernels one entry may stand for (a chunked launch); keeps the alignment small
MAX_ENTRY_COUNT = 64
_LAYER_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?$")


def read_layers(reader: LedgerReader, doc: dict[str, Any], ops: dict[str, OpDef]
                ) -> tuple[str | None, str | None, tuple[LayerClass, ...], LayerRule]:
    """(layer regex, opening op, layer classes, the rest of [layers] as a LayerRule)."""
    regex, opening, classes = read_layer_classes(reader, doc, ops)
    return regex, opening, classes, read_layer_rule(reader, doc, ops)


def read_layer_classes(reader: LedgerReader, doc: dict[str, Any], ops: dict[str, OpDef]
                       ) -> tuple[str | None, str | None, tuple[LayerClass, ...]]:
    table = reader.table(doc, "layers", "layers")
    if table is None:
        return None, None, ()
    reader.known(table, "layers", LAYERS_KEYS)
    layer_regex = None
    if "regex" in table:
        layer_regex = reader.regex(table["regex"], "layers.regex", "layer")
        groups = re.compile(layer_regex).groups
        if groups != 1:
            raise reader.fail(
                "layers.regex",
                f"the layer regex needs exactly one capturing group (the index), it has {groups}",
            )
    opening = reader.get(table, "opening_op", "layers", str)
    if opening is not None and opening not in ops:
        raise reader.fail("layers.opening_op", f"unknown op {opening!r} (ops: {short_list(ops)})")

    classes_table = reader.table(table, "classes", "layers.classes") or {}
    if not classes_table:
        return layer_regex, opening, ()
    if "layers" not in reader.params:
        raise reader.fail("params.layers", "missing required key 'layers' in [params] (needed by [layers.classes])")
    nlayers = reader.params["layers"]
    if not float(nlayers).is_integer() or nlayers < 1:
        raise reader.fail("params.layers", f"must be a whole number >= 1, got {nlayers!r}")
    nlayers = int(nlayers)
    declared_groups = {op.group for op in ops.values() if op.group}

    classes: list[LayerClass] = []
    owner: dict[tuple[int, str], str] = {}  # (layer, group) -> the class that declares it
    for cname, spec in classes_table.items():
        layer_class = read_layer_class(reader, cname, spec, nlayers, declared_groups, ops)
        for gname in layer_class.groups:
            for layer in layer_class.layers:
                other = owner.setdefault((layer, gname), cname)
                if other != cname:
                    raise reader.fail(
                        f"{layer_class.source}.groups.{gname}",
                        f"layer {layer} gets group {gname!r} from both class {other!r} and class {cname!r}",
                    )
        classes.append(layer_class)
    check_sequences(reader, classes)
    return layer_regex, opening, tuple(classes)


def check_sequences(reader: LedgerReader, classes: list[LayerClass]) -> None:
    """Each layer gets at most one class whose sequence stands alone, and a class that inserts
    its sequence needs, in every one of its layers, that sequence with its `insert_before` op."""
    base_of: dict[int, LayerClass] = {}
    for layer_class in classes:
        if not layer_class.sequence or layer_class.insert_before is not None:
            continue
        for layer in layer_class.layers:
            other = base_of.setdefault(layer, layer_class)
            if other is not layer_class:
                raise reader.fail(f"{layer_class.source}.sequence",
                                  f"layer {layer} gets a whole sequence from both class {other.name!r} and class "
                                  f"{layer_class.name!r} (one of them needs insert_before)")
    for layer_class in classes:
        if layer_class.insert_before is None:
            continue
        for layer in layer_class.layers:
            base = base_of.get(layer)
            if base is None or not any(e.op == layer_class.insert_before for e in base.sequence):
                raise reader.fail(f"{layer_class.source}.insert_before",
                                  f"layer {layer} has no class sequence with op {layer_class.insert_before!r} "
                                  "to insert before")


def read_sequence(reader: LedgerReader, value: Any, key: str, ops: dict[str, OpDef]) -> tuple[SequenceEntry, ...]:
    """`sequence`: an array of ``"op"``, ``"op low-high"``, ``"op|alternative n"`` strings."""
    if not isinstance(value, list) or not value:
        raise reader.fail(key, f"wrong type: expected a non-empty array of entries like \"op 0-1\", got {type_name(value)}")
    entries = []
    for index, item in enumerate(value):
        item_key = f"{key}[{index}]"
        m = _SEQUENCE_ENTRY.match(item) if isinstance(item, str) else None
        if m is None:
            raise reader.fail(item_key, f"cannot read {item!r} as a sequence entry (\"op\", \"op 0-1\", \"op|other 1-2\")")
        fills = tuple(name.strip() for name in m.group(1).split("|"))
        for name in fills:
            if name not in ops:
                raise reader.fail(item_key, f"unknown op {name!r} (ops: {short_list(ops)})")
        low = int(m.group(2)) if m.group(2) is not None else 1
        high = int(m.group(3)) if m.group(3) is not None else low
        if low > high:
            raise reader.fail(item_key, f"contradictory count in {item!r}: {low} > {high}")
        if high == 0 or high > MAX_ENTRY_COUNT:
            raise reader.fail(item_key, f"the count in {item!r} must be 1 to {MAX_ENTRY_COUNT} at most")
        entries.append(SequenceEntry(op=fills[0], fills=fills, low=low, high=high))
    return tuple(entries)


def read_layer_class(reader: LedgerReader, cname: str, spec: Any, nlayers: int,
                     declared_groups: set[str], ops: dict[str, OpDef] | None = None) -> LayerClass:
    key = f"layers.classes.{cname}"
    if not NAME.match(cname):
        raise reader.fail(key, f"class name {cname!r} must be letters, digits, _ or -")
    if not isinstance(spec, dict):
        raise reader.fail(key, f"wrong type: expected a table, got {type_name(spec)}")
    reader.known(spec, key, CLASS_KEYS)
    if "layers" not in spec:
        raise reader.fail(f"{key}.layers", f"missing required key 'layers' in [{key}]")
    reader.keep(f"{key}.layers", spec["layers"])
    layers = read_layer_list(reader, spec["layers"], f"{key}.layers", nlayers)
    if "count" in spec:
        reader.keep(f"{key}.count", spec["count"])
        want = reader.whole(spec["count"], f"{key}.count")
        if want != len(layers):
            raise reader.fail(
                f"{key}.layers",
                f"lists {len(layers)} layers but count = {shown(spec['count'])} = {want}",
            )
    groups_raw = reader.get(spec, "groups", key, dict, default={})
    if "groups" in spec:
        reader.keep(f"{key}.groups", groups_raw)
    groups: dict[str, Range] = {}
    for gname, value in groups_raw.items():
        gkey = f"{key}.groups.{gname}"
        if gname not in declared_groups:
            raise reader.fail(
                gkey,
                f"group {gname!r} is not declared by any op "
                f"(groups: {', '.join(sorted(declared_groups)) or 'none'})",
            )
        groups[gname] = reader.range_value(value, gkey)
    sequence: tuple[SequenceEntry, ...] = ()
    if "sequence" in spec:
        reader.keep(f"{key}.sequence", spec["sequence"])
        sequence = read_sequence(reader, spec["sequence"], f"{key}.sequence", ops or {})
    insert_before = reader.get(spec, "insert_before", key, str)
    if insert_before is not None and not sequence:
        raise reader.fail(f"{key}.insert_before", "insert_before needs a sequence in the same class")
    if insert_before is not None and insert_before not in (ops or {}):
        raise reader.fail(f"{key}.insert_before", f"unknown op {insert_before!r} (ops: {short_list(ops or {})})")
    return LayerClass(name=cname, layers=layers, groups=groups, source=key, sequence=sequence,
                      insert_before=insert_before)


def read_layer_rule(reader: LedgerReader, doc: dict[str, Any], ops: dict[str, OpDef]) -> LayerRule:
    """The inference keys, the sub-module map and `uniform` of [layers] (see LayerRule)."""
    table = reader.table(doc, "layers", "layers") or {}
    named_ops: dict[str, str | None] = {}
    for name in LAYER_RULE_OPS:
        op = reader.get(table, name, "layers", str)
        if op is not None and op not in ops:
            raise reader.fail(f"layers.{name}", f"unknown op {op!r} (ops: {short_list(ops)})")
        named_ops[name] = op
    uniform = reader.get(table, "uniform", "layers", bool, default=False)
    declared_groups = {op.group for op in ops.values() if op.group}
    modules: dict[str, tuple[str, ...]] = {}
    for submodule, value in (reader.table(table, "modules", "layers.modules") or {}).items():
        key = f"layers.modules.{submodule}"
        groups = [value] if isinstance(value, str) else value
        if not isinstance(groups, list) or not groups or not all(isinstance(g, str) for g in groups):
            raise reader.fail(key, f"wrong type: expected a group name or a non-empty array of group names, got {type_name(value)}")
        for group in groups:
            if group not in declared_groups:
                raise reader.fail(
                    key, f"group {group!r} is not declared by any op (groups: {', '.join(sorted(declared_groups))})"
                )
        modules[submodule] = tuple(groups)
    return LayerRule(modules=modules, uniform=uniform, **named_ops)


# ---- LAYERS: the layers of a class ----------------------------------------------------


def read_layer_list(reader: LedgerReader, value: Any, key: str, nlayers: int) -> tuple[int, ...]:
    """LAYERS: indexes and "a-b" strings, "0-2, 6-74/4", a pattern string, or {first, last, step}."""
    out: list[int] = []
    if isinstance(value, str):
        if not any(c.isdigit() for c in value):
            out = read_layer_pattern(reader, value, key, nlayers)
        else:
            for item in value.split(","):
                out.extend(read_layer_item(reader, item, key, nlayers))
    elif isinstance(value, list):
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool):
                out.append(item)
            elif isinstance(item, str):
                out.extend(read_layer_item(reader, item, key, nlayers))
            elif isinstance(item, dict):
                out.extend(read_layer_span(reader, item, key, nlayers))
            else:
                raise reader.fail(key, f"wrong type: a layer must be an integer or \"a-b\", got {type_name(item)}")
    elif isinstance(value, dict):
        out = read_layer_span(reader, value, key, nlayers)
    else:
        raise reader.fail(
            key, f"wrong type: expected an array, a string or a table of layers, got {type_name(value)}"
        )
    for layer in out:
        if not 0 <= layer < nlayers:
            raise reader.fail(key, f"layer {layer} is outside 0-{nlayers - 1} (params.layers = {nlayers})")
    if not out:
        raise reader.fail(key, "no layers listed")
    return tuple(sorted(set(out)))


def _within(reader: LedgerReader, key: str, first: int, last: int, step: int, nlayers: int | None) -> None:
    """Bound a range by the model's layers before it is expanded into a list (a typo such as
    "0-999999999" must not cost a billion list items first); names the first layer outside."""
    if nlayers is None:
        return
    outside = first if first < 0 or first >= nlayers else None
    if outside is None and last >= nlayers:
        beyond = first + -(-(nlayers - first) // step) * step  # the first of the range at or past nlayers
        outside = beyond if beyond <= last else None
    if outside is not None:
        raise reader.fail(key, f"layer {outside} is outside 0-{nlayers - 1} (params.layers = {nlayers})")


def read_layer_item(reader: LedgerReader, item: str, key: str, nlayers: int | None = None) -> list[int]:
    """``"5"``, ``"3-77"`` or ``"6-74/4"``."""
    m = _LAYER_ITEM.match(item)
    if not m:
        raise reader.fail(key, f"cannot read {item.strip()!r} as a layer or a range \"a-b\" / \"a-b/step\"")
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    step = int(m.group(3)) if m.group(3) is not None else 1
    if first > last:
        raise reader.fail(key, f"contradictory layer range {item.strip()!r}: {first} > {last}")
    if step < 1:
        raise reader.fail(key, f"the step in {item.strip()!r} must be at least 1")
    _within(reader, key, first, last, step, nlayers)
    return list(range(first, last + 1, step))


def read_layer_span(reader: LedgerReader, table: dict[str, Any], key: str, nlayers: int | None = None) -> list[int]:
    """``{ first = F, last = F, step = F }``, inclusive, formulas allowed."""
    reader.known(table, key, ("first", "last", "step"))
    for name in ("first", "last"):
        if name not in table:
            raise reader.fail(f"{key}.{name}", f"missing required key {name!r} in the layer span")
    first = reader.whole(table["first"], f"{key}.first", low=-(2**62))
    last = reader.whole(table["last"], f"{key}.last", low=-(2**62))
    step = reader.whole(table.get("step", 1), f"{key}.step", low=1)
    if first > last:
        raise reader.fail(key, f"contradictory layer span: first {first} > last {last}")
    _within(reader, key, first, last, step, nlayers)
    if (last - first) // step > 1_000_000:
        raise reader.fail(key, "layer span too long")
    return list(range(first, last + 1, step))


def read_layer_pattern(reader: LedgerReader, value: str, key: str, nlayers: int) -> list[int]:
    """One character per layer: ``F``/``X`` member, ``S``/``.`` not; spaces and ``_`` ignored."""
    chars = [c for c in value if c not in " _\t"]
    if len(chars) != nlayers:
        raise reader.fail(key, f"the layer pattern has {len(chars)} characters, expected one per layer ({nlayers})")
    out = []
    for i, c in enumerate(chars):
        if c in "FX":
            out.append(i)
        elif c not in "S.":
            raise reader.fail(key, f"unexpected character {c!r} in the layer pattern (F or X: member, S or .: not)")
    return out


def compact_layers(layers: Any) -> str:
    """``[0, 1, 2, 6, 10, 14]`` -> ``"0-2, 6-14/4"``; `read_layer_list` reads the result back."""
    xs = sorted(set(layers))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        if j > i:
            parts.append(f"{xs[i]}-{xs[j]}")
            i = j + 1
            continue
        if i + 2 < len(xs):
            step = xs[i + 1] - xs[i]
            j = i + 1
            while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
                j += 1
            # Leave a trailing consecutive pair to the next run ("6-14/4, 15-17").
            if j + 1 < len(xs) and xs[j + 1] == xs[j] + 1 and j - i >= 3:
                j -= 1
            if j - i >= 2:
                parts.append(f"{xs[i]}-{xs[j]}/{step}")
                i = j + 1
                continue
        parts.append(str(xs[i]))
        i += 1
    return ", ".join(parts)


# ---- writing ----------------------------------------------------------------------------


def write_layers(out: LedgerWriter, exp: Expectations) -> None:
    rule = exp.layer_rule
    has_table = (exp.layer_regex is not None or exp.layer_opening_op is not None or rule.uniform
                 or any(getattr(rule, name) is not None for name in LAYER_RULE_OPS))
    commented = any(f"layers.{name}" in out.comments for name in ("regex", "opening_op", *LAYER_RULE_OPS, "uniform"))
    if has_table or commented or "layers" in out.comments:
        out.table("layers")
        if exp.layer_regex is not None:
            out.value("layers", "regex", Literal(regex_string(exp.layer_regex)))
        if exp.layer_opening_op is not None:
            out.value("layers", "opening_op", exp.layer_opening_op)
        for name in LAYER_RULE_OPS:
            if getattr(rule, name) is not None:
                out.value("layers", name, getattr(rule, name))
        if rule.uniform:
            out.value("layers", "uniform", True)
    if rule.modules:
        out.table("layers.modules")
        for submodule, groups in rule.modules.items():
            out.value("layers.modules", submodule, groups[0] if len(groups) == 1 else list(groups))
    nlayers = int(exp.params.get("layers", 0))
    for layer_class in exp.layer_classes:
        write_layer_class(out, layer_class, nlayers)


def write_layer_class(out: LedgerWriter, layer_class: LayerClass, nlayers: int) -> None:
    key = f"layers.classes.{layer_class.name}"
    out.table(key)
    lkey = f"{key}.layers"
    layers = out.as_written(lkey, layer_class.layers, lambda raw: read_layer_list(out.reader, raw, lkey, nlayers),
                            compact_layers(layer_class.layers))
    out.value(key, "layers", layers)
    ckey = f"{key}.count"
    if ckey in out.written and out.reads_as(out.written[ckey], lambda raw: out.reader.whole(raw, ckey),
                                            len(layer_class.layers)):
        out.value(key, "count", out.written[ckey])
    if not layer_class.groups:
        return
    gkey = f"{key}.groups"

    def read_groups(raw: Any) -> dict[str, Range]:
        return {g: out.reader.range_value(v, f"{gkey}.{g}") for g, v in raw.items()}

    plain = {group: range_value(r) for group, r in layer_class.groups.items()}
    groups = out.as_written(gkey, layer_class.groups, read_groups, plain)
    if layer_class.sequence:
        out.value(key, "sequence", [entry.text() for entry in layer_class.sequence])
    if layer_class.insert_before is not None:
        out.value(key, "insert_before", layer_class.insert_before)
    if any(f"{gkey}.{group}" in out.comments for group in groups):
        # an inline table has no room for comments: one group per line in its own table
        out.table(gkey)
        for group, value in groups.items():
            out.value(gkey, group, value)
    else:
        out.value(key, "groups", groups)
