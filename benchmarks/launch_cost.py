"""What one launch costs here: python benchmarks/launch_cost.py [--repeats 10]

Times tensorplay_edu.launch of a function that does one all-reduce, for 1, 2 and 4
ranks: the first launch (which also starts the forkserver) and the median of the rest.
"""

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from tensorplay_edu import launch


def one_all_reduce():
    x = torch.ones(256)
    dist.all_reduce(x)
    return float(x[0])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    start = time.perf_counter()
    launch(one_all_reduce, 1)
    print(f"first launch (starts the forkserver, imports torch there): {time.perf_counter() - start:.2f} s")
    for world in (1, 2, 3, 4):
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            assert launch(one_all_reduce, world) == [float(world)] * world
            times.append(time.perf_counter() - start)
        print(f"{world} rank(s): median {statistics.median(times) * 1000:.0f} ms, "
              f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {args.repeats} launches")


if __name__ == "__main__":
    main()
