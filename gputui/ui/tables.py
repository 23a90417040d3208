"""A DataTable whose rows are keyed, and whose cursor row is "the selected one"."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable
from textual.widgets.data_table import CellDoesNotExist


class KeyedTable(DataTable[Text]):
    """Rows added with `key=`; `selected_key` is the cursor row's key (None when empty)."""

    @property
    def selected_key(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except CellDoesNotExist:
            return None
