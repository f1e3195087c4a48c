"""The control plane's ground floor: what every layer above may use and nothing here looks up.

The config and its pieces (``config``, ``tokens``, ``runas``, ``containment_settings``,
``observe_config``), the submit request (``jobspec``, ``arrays``), private files
(``privatefs``), crash points (``failpoints``), the tenant's view rules (``tenantview``), the
executor interface (``executor``: where work runs), and the per-member records the launcher
writes and the control plane reads (``launcher``, ``member_records``, ``record_reads``,
``memberenv``, ``jobdirs``).

Nothing is imported here: the launcher runs by file path (``python -I -S``) and must load only
its own records module beside it.
"""
