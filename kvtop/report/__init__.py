"""kvtop.report: ``kvtop report``, charts and a run comparison from recordings (and nothing else:
the estimate and calibrate tools are kvtop.estimate and kvtop.calibrate)."""
