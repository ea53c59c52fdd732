"""The tools people run on top of the simulator core (validation against published runs, predictions).

The core (engine, system layer, collectives, network and compute models, results) stays readable in one
sitting; commands that combine it with tables, model cards and reports live here. Older tools (sweep,
compare, validate, calibrate, plot, report) still sit in ``simulator/`` and may move here later.
"""
