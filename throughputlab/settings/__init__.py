"""One settings system for every command: a layered resolver over any pydantic settings model
(defaults < ``--spec FILE`` < flags < ``--set KEY=VALUE``), one spec-file reader, and flags
derived from the model. The models live with what they configure: the bench spec in
records.settings, the decide spec in decide.calculator, the predict spec in settings.predict."""

from throughputlab.settings.layers import (
    Layer,
    Settings,
    as_layer,
    dump_yaml,
    flatten,
    merge,
    parse_set,
    read_spec_file,
)

__all__ = ["Layer", "Settings", "as_layer", "dump_yaml", "flatten", "merge", "parse_set", "read_spec_file"]
