"""The one HTTP port of ``agora serve``: probes, metrics and the HTTP doors."""
