"""The family records (rlfarm/families.py): every name a record gives imports, every conf/algo file names a
family, a family's plan places exactly its roles, runs saved under an old family name still resume, and no module
but families.py tells families apart by name (a source check, itself tested on code that does)."""
import ast
import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import rlfarm
from rlfarm.config import CONF_DIR, compose
from rlfarm.errors import ConfigError, TopologyError
from rlfarm.families import FAMILIES, RENAMED, current_name, family_of, load, named
from rlfarm.run import saved_config
from rlfarm.topology import ROLE_NAMES, plan_topology

ALGOS = sorted(p.stem for p in (CONF_DIR / "algo").glob("*.yaml"))


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES)
def test_every_name_a_record_gives_imports(family):
    assert inspect.isclass(family.loop_class()) and hasattr(family.loop_class(), "train")
    for reference in (family.rules, family.paragraph, family.plan_rules):
        assert reference is None or callable(load(reference)), reference
    assert family.step_key in ("env_steps", "updates") and family.columns.shown
    assert set(family.roles) | set(family.optional_roles) <= set(ROLE_NAMES)


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algo_file_names_a_family(algo):
    assert family_of(compose("train", [f"algo={algo}"])).name in FAMILIES


def test_an_unknown_family_is_one_line_naming_the_families():
    with pytest.raises(ConfigError, match="algo.family must be one of offpolicy|ppo|llm|vla"):
        compose("train", ["algo.family=nope"])  # the schema refuses it while Hydra composes
    with pytest.raises(ConfigError, match="unknown algo.family 'nope' — the families are offpolicy, ppo, llm, vla"):
        named("nope")  # a config read without the schema (a saved one)


def test_a_run_saved_under_an_old_family_name_loads_under_the_new_one(tmp_path):
    for old, new in RENAMED.items():
        (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml({"algo": {"name": "x", "family": old}}))
        assert saved_config(tmp_path).algo.family == new == current_name(old)
        with pytest.raises(ConfigError, match=f"algo.family={old} is now called {new}"):
            named(old)  # typed today, the old name is refused with the new one


def topology(roles) -> dict:
    return {"name": "every_role", "roles": {role: {"count": 1, "cpus": 0.1} for role in roles}}


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES)
def test_a_familys_plan_places_exactly_its_roles(family):
    placed = {p.role for p in plan_topology(topology(ROLE_NAMES), family).placements}
    assert placed == set(family.roles) | set(family.optional_roles)
    assert {p.role for p in plan_topology(topology(family.roles), family).placements} == set(family.roles)
    for missing in family.roles:
        with pytest.raises(TopologyError, match=f"has no role '{missing}'"):
            plan_topology(topology([r for r in ROLE_NAMES if r != missing]), family)


@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES)
def test_learner_ranks_only_where_the_family_has_them(family):
    ranked = topology(ROLE_NAMES)
    ranked["roles"]["learner"]["count"] = 2
    if family.learner_ranks:
        assert len(plan_topology(ranked, family).of("learner")) == 2
    else:
        with pytest.raises(TopologyError, match="learner.count must be a whole number equal to 1"):
            plan_topology(ranked, family)


# ---- the rule: a family is told apart by its record, never by its name

FAMILY_WORDS = set(FAMILIES) | set(RENAMED)
# A family name that is also an algorithm's (algo=ppo) may key a table of algorithms (rlfarm.schemas.ALGO_SCHEMAS).
UNAMBIGUOUS = FAMILY_WORDS - set(ALGOS)


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


def family_name_uses(source: str) -> list[int]:
    """Lines of `source` that tell families apart by name: a comparison with a family name (or of anything
    about a family with a string), a dict keyed by family names, a lookup or match by one, or the name itself
    as a string (unless it is an algorithm's name too)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            strings = [s for operand in operands for s in _strings(operand)]
            about_family = any("famil" in ast.unparse(operand).lower() for operand in operands)
            hit = bool(FAMILY_WORDS & set(strings)) or (about_family and bool(strings))
        elif isinstance(node, ast.Dict):
            keys = [s for key in node.keys if key is not None for s in _strings(key)]
            hit = bool(UNAMBIGUOUS & set(keys)) or len(FAMILY_WORDS & set(keys)) > 1
        elif isinstance(node, ast.Subscript):
            keys = set(_strings(node.slice))
            hit = bool(UNAMBIGUOUS & keys) or (bool(FAMILY_WORDS & keys) and "famil" in ast.unparse(node.value).lower())
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            hit = bool(node.args) and bool(UNAMBIGUOUS & set(_strings(node.args[0])))
        elif isinstance(node, ast.MatchValue):
            hit = bool(FAMILY_WORDS & set(_strings(node.value)))
        elif isinstance(node, ast.Constant):  # a name passed on or set as a default: `columns = "llm"`
            hit = node.value in UNAMBIGUOUS
        else:
            continue
        if hit:
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("source", [
    'if cfg.algo.family == "llm":\n    pass',
    'single = role == "learner" and family not in ("onpolicy", "offpolicy")',
    'if cfg.algo.family != "sac":\n    pass',  # not a family at all, still a string compared with one
    'LOOPS = {"vla": ("rlfarm.loops.vla", "VLALoop")}',
    'columns = {"onpolicy": A, "ppo": B}.get(name, C)',
    'roles = FAMILY_ROLES["ppo"]',
    'roles = ROLES["llm"]',
    'x = PARAGRAPHS.get("offpolicy")',
    'match cfg.algo.family:\n    case "vla":\n        pass',
    'class SyncLoop:\n    columns = "onpolicy"',
    'plan = plan_topology(topology, "offpolicy")',
])
def test_the_source_check_catches_a_family_told_apart_by_name(source):
    assert family_name_uses(source), source


@pytest.mark.parametrize("source", [
    'if cfg.algo.loss == "impala":\n    pass',
    'ALGO_SCHEMAS = {"sac": SACSchema, "ppo": PPOSchema, "grpo": GRPOSchema}',
    'plan = plan_topology(cfg.topology, family_of(cfg))',
    '"""The llm family: engines generate, scorers score."""',
    'if run.family.learner_ranks:\n    pass',
])
def test_the_source_check_lets_the_rest_be(source):
    assert not family_name_uses(source), source


def test_no_module_but_families_py_tells_families_apart_by_name():
    package = Path(rlfarm.__file__).parent
    found = {str(path.relative_to(package.parent)): uses for path in sorted(package.rglob("*.py"))
             if path.name != "families.py" or path.parent != package
             for uses in [family_name_uses(path.read_text())] if uses}
    assert not found, f"family names compared or used as keys (lines) — ask the family record instead: {found}"
