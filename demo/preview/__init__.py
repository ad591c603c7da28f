"""A picture of the CloudWatch dashboard, and of a model-sync rollout, drawn from real data before deploying.

    bash scripts/preview.sh            # a demo run (real Triton, exporter, model sync on moto's S3), then the PNG
    python -m demo.preview draw RUN    # redraw from a run's collected files

Users import dashboards/triton.json into CloudWatch and see nothing of it
until they deploy. This package draws that dashboard from a real demo run:
:mod:`.collect` runs the demo's Triton, its traffic, the exporter for a few
short windows and model sync, and keeps their EMF and log lines;
:mod:`.emf` holds the EMF datapoints as CloudWatch would store them;
:mod:`.metricmath` evaluates each widget's metrics (SEARCH, metric math,
Metrics Insights, Contributor Insights rules) and :mod:`.logsinsights` each
log widget's query over those data; :mod:`.dashboard` lays the widgets out
on CloudWatch's 24-column grid with matplotlib, and its first screen
re-flowed for the README (docs/dashboard-preview-top.png); the run's exporter
reads the test suite's NVML fake, so the GPU graphs have values, each saying
where they come from. Only what the generated
dashboard uses is implemented, and anything else fails loudly
(:class:`~.metricmath.Unsupported`), so a new kind of widget cannot render
empty without a word. :mod:`.rollout` draws a model-sync rollout timeline.

Not shipped: demo/ is outside the packages the image installs.
"""
