"""What the benchmarks share, so that each of them reads as its case alone.

- `launcher`: the system a benchmark runs against: a scratch folder, PostgreSQL and Redis (its own unless
  given), Django set up in this process and migrated, the offline model and child processes, torn down in
  reverse on the way out;
- `processes`: child processes (Daphne, Celery workers and beat, servers), each in its own process group;
- `machine`: the machine the figures came from, and where its CPU went;
- `app`: the platform's services as the benchmarks call them (the one module that imports them);
- `results`: percentiles, the progress and the table printed, results JSON and plot under bench/results/.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
