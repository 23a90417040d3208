"""Moved to gputui.config.schema (one home for the schema and every profile table); kept so old imports work."""

from gputui.config.schema import Field, Section, Source, key, section_of

__all__ = ["Field", "Section", "Source", "key", "section_of"]
