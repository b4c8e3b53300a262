"""Exports of a scenario for other tools (``hybridsim export ...``)."""
