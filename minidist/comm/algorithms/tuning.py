"""Tuned all-reduce selection for this machine: generated, do not edit by hand.

Regenerate (repeated runs per world size; see docs/benchmarks.md):
  ./mpirun.sh -n N python benchmarks/allreduce.py --name allreduce_nN_runI  (I=1..3)
  python benchmarks/allreduce.py --fit benchmarks/results/allreduce_n*_run*.json --emit-module
Source: benchmarks/results/allreduce_n2_run1.json, benchmarks/results/allreduce_n2_run2.json, benchmarks/results/allreduce_n2_run3.json, benchmarks/results/allreduce_n3_run1.json, benchmarks/results/allreduce_n3_run2.json, benchmarks/results/allreduce_n4_run3.json, benchmarks/results/allreduce_n4_run4.json.
Format: see select.load_model."""

DATA = {'model': {'direct': {'alpha_us': 24.730540731600936,
                      'beta_us_per_byte': 0.0001970228761675316,
                      'gamma_us_per_byte': 7.67866372699752e-05},
           'mpi': {'alpha_us': 15.975112933463143,
                   'beta_us_per_byte': 0.00035953650565100976,
                   'gamma_us_per_byte': 7.67866372699752e-05},
           'rd': {'alpha_us': 47.08855619873865,
                  'beta_us_per_byte': 0.00022553363786661536,
                  'gamma_us_per_byte': 7.67866372699752e-05},
           'ring': {'alpha_us': 33.506575209824575,
                    'beta_us_per_byte': 0.00024179820049419838,
                    'gamma_us_per_byte': 7.67866372699752e-05},
           'shm': {'alpha_us': 36.40060782673154,
                   'beta_us_per_byte': 0.0002734281653517031,
                   'gamma_us_per_byte': 7.67866372699752e-05},
           'shm_zc': {'alpha_us': 50.85662966688461,
                      'beta_us_per_byte': 9.851436328583253e-05,
                      'gamma_us_per_byte': 7.67866372699752e-05},
           'tree': {'alpha_us': 27.565633835338158,
                    'beta_us_per_byte': 0.00019724810755752364,
                    'gamma_us_per_byte': 7.67866372699752e-05}},
 'rules': {'2': [[741455, 'mpi'], [None, 'ring']],
           '2s': [[185364, 'mpi'], [None, 'shm']],
           '3': [[262144, 'mpi'], [1048576, 'tree'], [None, 'shm']],
           '3s': [[65536, 'mpi'], [None, 'shm']],
           '4': [[741455, 'mpi'], [None, 'shm']],
           '4s': [[92682, 'mpi'], [None, 'shm']]}}
