-- tunelab warehouse, schema version 11: where the server and the load ran, and what else the host did in each
-- window (tasks/host_load.py). Covariates a config cannot change: other processes' CPU use, steal, the CPU
-- frequency. (GPU utilisation and power, in gpu_samples, are outcomes: a config changes them.) NULL for rows
-- measured before version 10, and where /proc or cpufreq could not be read.
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS host_other_cpu_frac DOUBLE;  -- CPU time of processes not tunelab's / all host CPU time in the window (0..1)
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS host_steal_frac DOUBLE;      -- CPU time stolen by the hypervisor / all host CPU time in the window
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS host_cpu_mhz DOUBLE;         -- mean CPU frequency at the window's end, MHz
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS server_cpus VARCHAR;         -- the server's CPUs (plan cpu_affinity.server); NULL: not pinned
ALTER TABLE measurements ADD COLUMN IF NOT EXISTS load_cpus VARCHAR;           -- the load generator's CPUs (plan cpu_affinity.load); NULL: not pinned
