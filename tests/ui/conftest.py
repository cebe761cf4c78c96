from tests.ui.browser import browser, tab

__all__ = ["browser", "tab"]
