"""What every output of render builds on: its settings (options), the stack parameters they become
(params), and metric references and widgets checked against the catalog (widgets)."""
