"""Everything plan3d prints: the consoles, the formatters and one module per command's output.

- ``console``: stdout/stderr consoles, their width, errors, JSON, a closed stdout (exit 141);
- ``fmt``: the formatters (durations, GiB, bandwidth, parameters, %, tokens/s, money, floats);
- ``tables``: the table style and the wide/narrow choice that keeps numbers whole at 80 columns;
- ``search``, ``breakdown``, ``whynot``, ``sweep``, ``plot``: planning output;
- ``fidelity``, ``regress``, ``validate``: checking output; ``placement``, ``catalog``: listings.

Renderers format data computed elsewhere (planner.explain, planner.search, ...); nothing outside
planner.render and planner.cli prints.
"""
