"""Schemas written as DDL (``"ts TIMESTAMP, user STRING, amount DOUBLE"``) read without a
JVM, for the commonest form: a list of ``name type`` fields of Spark's primitive types.

PySpark parses DDL in the driver's JVM (``StructType.fromDDL``): a driver that never
starts Spark (:mod:`riverbed.spark.lazy`) reads its topic's schema here instead. Whatever
is not of that form — decimals, nested types, comments, a syntax error — is None, and
the caller asks Spark, which says what Spark says. What this reads equals what Spark
reads (``tests/spark/test_ddl.py`` checks it against Spark, field by field)."""

from __future__ import annotations

import re

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

# Spark's names of its primitive types (any case), and what each is
TYPES: dict[str, DataType] = {
    "string": StringType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "bigint": LongType(),
    "long": LongType(),
    "smallint": ShortType(),
    "short": ShortType(),
    "tinyint": ByteType(),
    "byte": ByteType(),
    "double": DoubleType(),
    "float": FloatType(),
    "real": FloatType(),
    "boolean": BooleanType(),
    "date": DateType(),
    "timestamp": TimestampType(),
    "timestamp_ltz": TimestampType(),
    "timestamp_ntz": TimestampNTZType(),
    "binary": BinaryType(),
}

_FIELD = re.compile(
    r"\s*(?:`([^`]+)`|([A-Za-z_][A-Za-z0-9_]*))"  # a name, plain or in backquotes
    r"(?:\s*:\s*|\s+)([A-Za-z_]+)"  # its type, after a space or a colon
    r"(\s+not\s+null)?\s*",  # NOT NULL
    re.IGNORECASE,
)


def simple_schema(ddl: str) -> StructType | None:
    """The struct ``ddl`` declares, when it is a list of ``name type [NOT NULL]`` fields
    of primitive types; None otherwise (ask Spark)."""
    fields = []
    for part in ddl.split(","):
        matched = _FIELD.fullmatch(part)
        if matched is None:
            return None
        quoted, plain, kind, not_null = matched.groups()
        found = TYPES.get(kind.lower())
        if found is None:
            return None
        fields.append(StructField(quoted or plain, found, nullable=not_null is None))
    return StructType(fields)
