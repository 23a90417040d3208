"""The dashboard (Textual). The only package that imports Textual; `gputui.ui.app.create_app` builds it.

Layout at every size (the screen gets size classes from DashboardBase's breakpoints; the rules
are in dashboard.tcss). The README's sizes, 80x24, 100x30, 120x40 and 200x50, are snapshot-tested.

- 120 columns or more: hosts and training side by side; cost (summary, slaves table, what u and d
  will do) and events below, full width.
- 100 to 119 columns: the same, the training panel wider (3/5); the cost summary packs into two
  lines above the slaves table.
- Below 100 columns: one column that scrolls: hosts (up to 12 rows), training, cost, events.
  Tab / Shift+Tab move between the panels and scroll the screen to the focused one.
- 40 rows or more: cost 9 rows, events 8; 30 to 39: cost 9, events 6; below 30: cost 7, events 4.
  A profile without a cloud: the cost row holds its one note in 4 rows.

What goes first when a panel is too narrow, in this fixed order (nothing is cut mid-number):
1. Hosts, GPU rows: the utilisation sparkline, then a throttle reason (the power figure stays
   coloured when a busy GPU is held back), then the per-GPU name column (the model stays on the
   host line), then the utilisation and memory bars, then the padding between figures. The
   figures (util %, memory used/total, temperature, power/limit) are never dropped nor cut.
2. Hosts, host line: RAM, then CPU. The name and the GPU model stay; a reason (an unreachable
   host's error) wraps onto up to three lines below it.
3. Status line: the mode note, then the profile is cut; the clock stays.
4. Cost: one figure a line becomes two packed lines; the slaves table shows a zone by its suffix
   (1c) below 80 columns; what u and d will do wraps onto two lines.
5. Footer: the keys scroll off to the right (mouse wheel), except ? Help and q Quit, pinned.

Everything that does not fit can be reached with the keyboard: the hosts panel, the slaves table
and the events log take the focus (Tab, or a click) and scroll with the arrows, PgUp/PgDn and
Home/End; the help (?) scrolls the same way. Text from outside the process is drawn as rich Text,
never markup.
"""
