"""Operations: metrics, traces, health and readiness, structured logs, the doctor.

They read the domain and never change it; each failure (an exporter down, a
collector unreachable, a store that hangs during a scrape) degrades to a log
line and a metric, never to a failed request or job.
"""
