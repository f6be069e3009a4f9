"""Airflow pieces of modeswitch: task callables, the epoch job operator, the lag sensor and
its deferrable trigger. Plain modules, imported by the DAG files in ``dags/``; everything that
reads Variables, Connections or the control tables does so at run time, never at import.
"""
