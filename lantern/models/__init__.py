"""Model providers, routes, prices and budgets: what a model step calls and what it costs."""
