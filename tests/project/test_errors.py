"""One error family: every layer's errors derive from CastSQLError, an upper
layer's defined in that layer (docs/DESIGN.md §6), their old import paths kept."""

from __future__ import annotations

import pyarrow as pa
import pytest

import castsql
import castsql.errors as errors
from castsql.format.change import DmlConflict, RestoreRaced
from castsql.shell.errors import ShellError
from castsql.spark.errors import BadCondition, BadOption, SparkJobFailed, WrongType
from castsql.write_cli import UsageError, main


def test_every_layers_errors_derive_from_the_root_and_live_in_their_layer():
    upper = {
        ShellError: "castsql.shell.errors",
        UsageError: "castsql.cli.common",
        BadOption: "castsql.spark.errors",
        SparkJobFailed: "castsql.spark.errors",
        WrongType: "castsql.spark.errors",
        BadCondition: "castsql.spark.errors",
    }
    for cls, module in upper.items():
        assert issubclass(cls, errors.CastSQLError), cls
        assert cls.__module__ == module, cls
    for cls in (RestoreRaced, DmlConflict):
        assert issubclass(cls, errors.CommitConflict)
        assert cls.__module__ == "castsql.errors"


def test_the_old_import_paths_give_the_same_classes():
    from castsql.errors import BadOption as OldBadOption
    from castsql.errors import ShellError as OldShellError
    from castsql.errors import UsageError as OldUsageError

    assert (OldShellError, OldUsageError, OldBadOption) == (ShellError, UsageError, BadOption)
    assert (errors.SparkJobFailed, errors.WrongType, errors.BadCondition) == (SparkJobFailed, WrongType, BadCondition)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        errors.NoSuchError  # noqa: B018


def test_spark_compact_options_of_the_embedded_engine_are_refused_before_spark_starts(tmp_path, capsys):
    uri = str(tmp_path / "t")
    before = castsql.write_table(uri, pa.table({"id": [1, 2]})).version
    code = main(["compact", uri, "--engine", "spark", "--sort-by", "id"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == "castsql compact: error: compact: --target-file-size and --sort-by need --engine duckdb"
    assert castsql.open(uri).version == before  # nothing committed
