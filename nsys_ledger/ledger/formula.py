"""A tiny, safe arithmetic evaluator for the formulas of an expectations file.

Formulas such as ``2 * layers`` or ``ceil(full_indexer_layers * 1.1)`` are parsed with
``ast.parse(expr, mode="eval")`` and the tree is walked here; nothing is ever handed to
``eval`` or ``compile``. Only these constructs are accepted:

- int and float literals (no booleans, strings, complex numbers or containers),
- names of declared parameters,
- ``+ - * / // %``, unary ``-``/``+``, parentheses,
- ``**`` with ``|exponent| <= 64``,
- calls of ``min``, ``max``, ``ceil``, ``floor`` (positional arguments only).

Every intermediate result must be finite and at most `MAX_MAGNITUDE` in size. Anything else
raises `FormulaError` with a message that names the offending construct.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping

Number = int | float

MAX_LENGTH = 1000  # characters in one formula
MAX_EXPONENT = 64
MAX_MAGNITUDE = 2**63  # bound on every intermediate result

FUNCTIONS = {
    "ceil": (1, 1),  # name -> (min args, max args)
    "floor": (1, 1),
    "max": (1, None),
    "min": (1, None),
}

_BINOPS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
}

# Names for constructs that are refused, for messages.
_REFUSED = {
    ast.Attribute: "attribute access",
    ast.Subscript: "subscript",
    ast.List: "list",
    ast.Tuple: "tuple",
    ast.Set: "set",
    ast.Dict: "dict",
    ast.Lambda: "lambda",
    ast.ListComp: "list comprehension",
    ast.SetComp: "set comprehension",
    ast.DictComp: "dict comprehension",
    ast.GeneratorExp: "generator expression",
    ast.Compare: "comparison",
    ast.BoolOp: "boolean operator",
    ast.IfExp: "conditional expression",
    ast.NamedExpr: "assignment expression",
    ast.JoinedStr: "f-string",
    ast.FormattedValue: "f-string",
    ast.Starred: "starred expression",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
    ast.Slice: "slice",
}


class FormulaError(ValueError):
    """A formula that cannot be evaluated; `key` is the parameter it belongs to, if known."""

    def __init__(self, message: str, key: str | None = None):
        self.message = message
        self.key = key
        super().__init__(message if key is None else f"{key}: {message}")


def _check_text(expr: object) -> str:
    if not isinstance(expr, str):
        raise FormulaError(f"a formula must be a string, got {type(expr).__name__}")
    if not expr.strip():
        raise FormulaError("empty formula")
    if len(expr) > MAX_LENGTH:
        raise FormulaError(f"formula longer than {MAX_LENGTH} characters")
    return expr


def _parse(expr: str) -> ast.Expression:
    try:
        return ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        raise FormulaError(f"not a valid formula {expr!r}: {exc.msg}{where}") from None
    except (RecursionError, MemoryError, ValueError):
        raise FormulaError(f"not a valid formula {expr!r}: too deeply nested") from None


class _Evaluator:
    def __init__(self, expr: str, names: Mapping[str, Number]):
        self.expr = expr.strip()
        self.names = names

    def text(self, node: ast.AST) -> str:
        seg = ast.get_source_segment(self.expr, node)
        return seg if seg is not None else type(node).__name__

    def refuse(self, node: ast.AST) -> FormulaError:
        what = _REFUSED.get(type(node))
        if isinstance(node, ast.Constant):
            value = node.value
            if isinstance(value, bool):
                what = f"boolean {value!r}"
            elif isinstance(value, str):
                what = f"string {value!r}"
            elif isinstance(value, bytes):
                what = "bytes literal"
            elif isinstance(value, complex):
                what = "complex number"
            elif value is None:
                what = "None"
            elif value is Ellipsis:
                what = "ellipsis"
            else:
                what = f"constant {value!r}"
            return FormulaError(f"{what} is not allowed in formula {self.expr!r}")
        if what is None:
            what = f"{type(node).__name__} expression"
        return FormulaError(f"{what} `{self.text(node)}` is not allowed in formula {self.expr!r}")

    def check(self, value: Number, node: ast.AST) -> Number:
        if isinstance(value, complex):
            raise FormulaError(f"`{self.text(node)}` gives a complex number in formula {self.expr!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise FormulaError(f"`{self.text(node)}` is not finite in formula {self.expr!r}")
        if abs(value) > MAX_MAGNITUDE:
            raise FormulaError(
                f"`{self.text(node)}` is too large (more than 2**63) in formula {self.expr!r}"
            )
        return value

    def eval(self, node: ast.AST) -> Number:
        if isinstance(node, ast.Expression):
            return self.eval(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return self.check(node.value, node)
            raise self.refuse(node)
        if isinstance(node, ast.Name):
            if node.id in self.names:
                value = self.names[node.id]
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise FormulaError(f"parameter {node.id!r} is not a number")
                return value
            if node.id in FUNCTIONS:
                raise FormulaError(f"function {node.id!r} must be called, in formula {self.expr!r}")
            raise FormulaError(f"unknown name {node.id!r} in formula {self.expr!r}{self._known()}")
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return self.check(-self.eval(node.operand), node)
            if isinstance(node.op, ast.UAdd):
                return self.eval(node.operand)
            op = {ast.Not: "not", ast.Invert: "~"}.get(type(node.op), type(node.op).__name__)
            raise FormulaError(f"operator {op!r} in `{self.text(node)}` is not allowed in formula {self.expr!r}")
        if isinstance(node, ast.BinOp):
            return self.binop(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.refuse(node)

    def _known(self) -> str:
        if not self.names:
            return " (no parameters declared)"
        names = sorted(self.names)
        shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
        return f" (parameters: {shown})"

    def binop(self, node: ast.BinOp) -> Number:
        symbol = _BINOPS.get(type(node.op))
        if symbol is None:
            op = {
                ast.BitAnd: "&",
                ast.BitOr: "|",
                ast.BitXor: "^",
                ast.LShift: "<<",
                ast.RShift: ">>",
                ast.MatMult: "@",
            }.get(type(node.op), type(node.op).__name__)
            raise FormulaError(f"operator {op!r} in `{self.text(node)}` is not allowed in formula {self.expr!r}")
        left = self.eval(node.left)
        right = self.eval(node.right)
        if symbol in ("/", "//", "%") and right == 0:
            raise FormulaError(f"division by zero in `{self.text(node)}` in formula {self.expr!r}")
        if symbol == "**":
            if abs(right) > MAX_EXPONENT:
                raise FormulaError(
                    f"exponent {right!r} in `{self.text(node)}` is too large "
                    f"(at most {MAX_EXPONENT}) in formula {self.expr!r}"
                )
            if left == 0 and right < 0:
                raise FormulaError(f"division by zero in `{self.text(node)}` in formula {self.expr!r}")
            # Bound the size before computing: |left| ** |right| must stay within MAX_MAGNITUDE.
            if abs(left) > 1 and right > 0 and right * math.log2(abs(left)) > 63:
                raise FormulaError(
                    f"`{self.text(node)}` is too large (more than 2**63) in formula {self.expr!r}"
                )
        try:
            if symbol == "+":
                value = left + right
            elif symbol == "-":
                value = left - right
            elif symbol == "*":
                value = left * right
            elif symbol == "/":
                value = left / right
            elif symbol == "//":
                value = left // right
            elif symbol == "%":
                value = left % right
            else:
                value = left**right
        except (ZeroDivisionError, OverflowError, ValueError) as exc:
            raise FormulaError(f"`{self.text(node)}` cannot be computed ({exc}) in formula {self.expr!r}") from None
        return self.check(value, node)

    def call(self, node: ast.Call) -> Number:
        func = node.func
        if not isinstance(func, ast.Name):
            raise FormulaError(
                f"call of `{self.text(func)}` is not allowed in formula {self.expr!r} "
                f"(functions: {', '.join(sorted(FUNCTIONS))})"
            )
        if func.id not in FUNCTIONS:
            raise FormulaError(
                f"call of {func.id!r} is not allowed in formula {self.expr!r} "
                f"(functions: {', '.join(sorted(FUNCTIONS))})"
            )
        if node.keywords:
            raise FormulaError(f"keyword arguments in `{self.text(node)}` are not allowed in formula {self.expr!r}")
        low, high = FUNCTIONS[func.id]
        if len(node.args) < low or (high is not None and len(node.args) > high):
            want = f"{low}" if low == high else f"at least {low}"
            raise FormulaError(
                f"{func.id}() takes {want} argument{'s' if want != '1' else ''}, "
                f"got {len(node.args)} in `{self.text(node)}` in formula {self.expr!r}"
            )
        args = [self.eval(a) for a in node.args]  # Starred is refused by eval()
        if func.id == "min":
            return min(args)
        if func.id == "max":
            return max(args)
        if func.id == "ceil":
            return self.check(math.ceil(args[0]), node)
        return self.check(math.floor(args[0]), node)


def _normalize(value: Number) -> Number:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def evaluate(expr: str | int | float, names: Mapping[str, Number] | None = None) -> Number:
    """Evaluate a formula (or pass a plain number through) over `names`.

    Integral results come back as int (``78 / 2`` gives ``39``), others as float.
    """
    names = names or {}
    if isinstance(expr, bool):
        raise FormulaError(f"expected a number or a formula, got boolean {expr!r}")
    if isinstance(expr, (int, float)):
        if isinstance(expr, float) and not math.isfinite(expr):
            raise FormulaError(f"{expr!r} is not a finite number")
        if abs(expr) > MAX_MAGNITUDE:
            raise FormulaError(f"{expr!r} is too large (more than 2**63)")
        return _normalize(expr)
    text = _check_text(expr)
    tree = _parse(text)
    evaluator = _Evaluator(text, names)
    try:
        return _normalize(evaluator.eval(tree))
    except RecursionError:
        raise FormulaError(f"formula {text.strip()!r} is too deeply nested") from None


def referenced_names(expr: str | int | float) -> set[str]:
    """The parameter names a formula refers to (function names excluded); syntax is checked."""
    if isinstance(expr, (int, float)):
        return set()
    tree = _parse(_check_text(expr))
    # A called name is a function, never a parameter; evaluate() refuses the unknown ones.
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in callees}


def evaluate_params(raw: Mapping[str, object]) -> dict[str, Number]:
    """Evaluate parameters that may refer to each other, in dependency order.

    Raises `FormulaError` with `key` set to the parameter at fault: an unknown name, a cycle
    (``a -> b -> a``), a value that is neither a number nor a formula, or a formula error.
    The result keeps the declaration order of `raw`.
    """
    deps: dict[str, set[str]] = {}
    for name, value in raw.items():
        if not name.isidentifier() or name.startswith("__"):
            raise FormulaError(f"{name!r} is not a valid parameter name (use letters, digits, _)", key=name)
        if name in FUNCTIONS:
            raise FormulaError(f"{name!r} is a function name and cannot be a parameter", key=name)
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise FormulaError(
                f"expected a number or a formula string, got {type(value).__name__}", key=name
            )
        try:
            deps[name] = referenced_names(value)
        except FormulaError as exc:
            raise FormulaError(exc.message, key=name) from None
        for ref in sorted(deps[name]):
            if ref not in raw:
                raise FormulaError(f"unknown parameter {ref!r} in formula {value!r}", key=name)

    values: dict[str, Number] = {}
    state: dict[str, int] = {}  # 1 = in progress, 2 = done

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = path[path.index(name):] + [name]
            raise FormulaError(f"parameters refer to each other in a cycle: {' -> '.join(cycle)}", key=name)
        state[name] = 1
        for ref in sorted(deps[name]):
            visit(ref, path + [name])
        try:
            values[name] = evaluate(raw[name], values)  # type: ignore[arg-type]
        except FormulaError as exc:
            raise FormulaError(exc.message, key=name) from None
        state[name] = 2

    for name in raw:
        visit(name, [])
    return {name: values[name] for name in raw}
