"""Mirrors of a CastSQL table in other formats, over its own data files: a Delta log (:mod:`castsql.mirror.delta`)."""
