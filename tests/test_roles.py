"""Op roles: one vocabulary across ledgers (nsys_ledger/ledger/roles.py)."""

from pathlib import Path

import pytest

from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger import load_expectations
from nsys_ledger.ledger.document import write_expectations
from nsys_ledger.ledger.roles import ROLES, role_order

LEDGERS = sorted(Path(__file__).resolve().parents[1].glob("expectations/*.toml"))


def test_vocabulary_follows_the_article():
    assert len(ROLES) == 39
    names = list(ROLES)
    # the attention rows in the article's order: norm (row 1) before qkv_a (row 2) before o_proj (row 12)
    assert names.index("residual_norm") < names.index("qkv_a_proj") < names.index("o_proj") < names.index("allreduce")
    assert role_order("embedding") == 0 and role_order(None) == 39 and role_order("no-such-role") == 39


@pytest.mark.parametrize("path", LEDGERS, ids=[p.stem for p in LEDGERS])
def test_every_shipped_op_has_a_role(path):
    exp = load_expectations(path)
    missing = [name for name, op in exp.ops.items() if op.role is None]
    assert missing == []
    # the seed's rows that every ledger names the same way
    roles = {name: op.role for name, op in exp.ops.items()}
    assert roles["fused_add_rmsnorm"] == "residual_norm"
    assert roles["sparse_mla"] == "attention"
    assert roles["paged_mqa_logits"] == "indexer_logits"
    assert roles["moe_sum"] == "moe_sum"
    # the MoE dispatch: DeepEP in the SGLang ledgers; vLLM at data parallel 1 runs no
    # all-to-all, its local permutation (moe_align_block_size) has the role
    dispatch = "moe_align" if "vllm" in path.stem else "deepep_dispatch"
    assert roles[dispatch] == "moe_dispatch"


def test_role_round_trips_through_the_writer(tmp_path):
    exp = load_expectations(LEDGERS[0])
    text = write_expectations(exp)
    assert 'role = "residual_norm"' in text
    out = tmp_path / "again.toml"
    out.write_text(text)
    again = load_expectations(out)
    assert {n: o.role for n, o in again.ops.items()} == {n: o.role for n, o in exp.ops.items()}


def test_unknown_role_is_one_clear_error(tmp_path):
    ledger = tmp_path / "bad.toml"
    text = LEDGERS[0].read_text().replace('role = "residual_norm"', 'role = "normalisation"', 1)
    ledger.write_text(text)
    with pytest.raises(ExpectationsError) as err:
        load_expectations(ledger)
    assert "ops.fused_add_rmsnorm.role" in str(err.value) and "unknown role 'normalisation'" in str(err.value)
