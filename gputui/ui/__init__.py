"""The dashboard (Textual). The only package that imports Textual; `gputui.ui.app.create_app` builds it."""
