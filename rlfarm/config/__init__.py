"""Composing conf/ before a run starts, and what Hydra cannot check, each problem as one clear line.

The config is plain Hydra: conf/ holds one directory per choice, and the schemas in rlfarm/schemas.py type its
keys, so Hydra refuses a wrong type, choice or key while it composes (`compose` turns its exceptions into a
ConfigError from their fields) and each schema's `__post_init__` checks ranges (`check_schema_ranges`). `validate`
adds what no single config group can say: the rules across groups of the config's algorithm family (its record in
rlfarm/families.py names them) and the paths a config names (files and model folders, declared in
rlfarm.schemas.PATH_SETTINGS; `_target_`s). `check_known_keys` refuses what Hydra lets through: a key added with
`+` that nothing reads.

One module a job: search (where config files are found: conf/, --config-dir, hydra.searchpath), composition
(compose and Hydra's errors), validation (ranges, targets, env ids, the family's rules), family_rules (those
rules), probes (what only building the env, the policy and the reward can tell), known_keys, paths (the paths a
config names and the run directory). What other modules use is imported from here.
"""
from rlfarm.config.composition import check_plus_on_groups, compose, sweep_variants
from rlfarm.config.known_keys import check_known_keys
from rlfarm.config.paths import check_output_dir, check_paths, path_problem
from rlfarm.config.search import CONF_DIR, group_names, group_options, use_command_line
from rlfarm.config.validation import check_env_id, check_schema_ranges, check_targets, locate_problem, validate

__all__ = ["CONF_DIR", "check_env_id", "check_known_keys", "check_output_dir", "check_paths", "check_plus_on_groups",
           "check_schema_ranges", "check_targets", "compose", "group_names", "group_options", "locate_problem",
           "path_problem", "sweep_variants", "use_command_line", "validate"]
