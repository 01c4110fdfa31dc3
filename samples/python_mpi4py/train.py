#!/usr/bin/python3
"""A small data-parallel training job in Python with numpy and mpi4py, the kind of job gradscope profiles.

It trains a three-layer perceptron (64 -> 128 -> 32 -> 10, ReLU, softmax cross-entropy) on synthetic
data, each rank on its own shard, and averages the gradients over the ranks as data-parallel frameworks
do (the same job as samples/mpi_train, written with mpi4py's buffer interface):

  setup      comm.Bcast of the initial weights from rank 0 (one call, all parameters, float32)
  each step  comm.Allreduce(MPI.IN_PLACE, SUM) of each float32 gradient tensor, last layer first, as
             the backward pass produces them; the 128x32 weight's gradient goes through
             comm.Iallreduce and is waited for after the first layer's backward pass (--blocking:
             comm.Allreduce instead); then comm.Allreduce of the float64 loss for logging.

Underneath, each of these is one MPI_Bcast, MPI_Allreduce or MPI_Iallreduce (+ MPI_Wait) on
MPI_COMM_WORLD with MPI_FLOAT or MPI_DOUBLE, so a step makes seven collectives, in this order:
  Allreduce 320 fp32, Allreduce 10 fp32, Iallreduce 4096 fp32, Allreduce 32 fp32,
  Allreduce 8192 fp32, Allreduce 128 fp32, Allreduce 1 fp64.

Deterministic for a given rank count: numpy's generator with fixed seeds, single-threaded BLAS (set
below, before numpy loads), and MPI's reductions, deterministic for a fixed communicator size. Rank 0
prints the final loss with float.hex() and an FNV-1a hash of the final weights' bytes, so two runs can be
compared bit for bit.

  mpirun -np 2 /usr/bin/python3 samples/python_mpi4py/train.py [--steps N] [--sleep-ms M]
"""

import argparse
import os
import sys
import time

# One BLAS thread per rank: the ranks already fill the cores, and the result must not depend on how a
# multi-threaded BLAS splits its sums. Set before numpy is imported, which is when BLAS reads them.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

PROGRAM = "gradscope-sample-python-mpi4py"
WIDTHS = (64, 128, 32, 10)  # three weight gradients (64x128, 128x32, 32x10) and three bias gradients
BATCH = 32  # samples per rank and step
SHARD_SAMPLES = 512  # samples per rank, visited in order, batch by batch
LEARNING_RATE = np.float32(0.2)
WEIGHT_SEED, TEACHER_SEED, DATA_SEED = 0x5EED0001, 0x5EED0002, 0x5EED0003


def parse_arguments():
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--sleep-ms", type=int, default=0, help="sleep M ms in every step (default 0)")
    parser.add_argument("--print-every", type=int, default=5,
                        help="rank 0 prints the loss every K steps; 0: only at the end (default 5)")
    parser.add_argument("--blocking", dest="nonblocking", action="store_false",
                        help="reduce every gradient with Allreduce (default: one with Iallreduce + Wait)")
    parser.add_argument("--nonblocking", dest="nonblocking", action="store_true", default=True,
                        help="reduce one gradient with Iallreduce + Wait (the default)")
    parser.add_argument("--print-pid", action="store_true", help="every rank prints its pid to stderr at start")
    parser.add_argument("--exit-code", type=int, default=0, help="exit with this status at the end (default 0)")
    arguments = parser.parse_args()
    if arguments.steps < 0 or arguments.sleep_ms < 0 or arguments.print_every < 0:
        parser.error("--steps, --sleep-ms and --print-every must be >= 0")
    return arguments


class Parameters:
    """All parameters in one flat float32 buffer (one Bcast at setup), with per-layer weight and bias
    views into it. The gradients are a second object of this class: same layout."""

    def __init__(self):
        sizes = [WIDTHS[i] * WIDTHS[i + 1] + WIDTHS[i + 1] for i in range(len(WIDTHS) - 1)]
        self.flat = np.zeros(sum(sizes), dtype=np.float32)
        self.weights, self.biases = [], []
        offset = 0
        for inputs, outputs in zip(WIDTHS[:-1], WIDTHS[1:]):
            self.weights.append(self.flat[offset:offset + inputs * outputs].reshape(inputs, outputs))
            offset += inputs * outputs
            self.biases.append(self.flat[offset:offset + outputs])
            offset += outputs


def initialise(parameters):
    """He-style uniform initialisation (bound sqrt(6 / fan_in)); biases stay zero."""
    rng = np.random.default_rng(WEIGHT_SEED)
    for weight in parameters.weights:
        bound = np.sqrt(6.0 / weight.shape[0])
        weight[...] = rng.uniform(-bound, bound, size=weight.shape).astype(np.float32)


def make_shard(rank):
    """This rank's inputs (uniform in [-1, 1)) and labels from a fixed linear "teacher" all ranks share."""
    teacher = np.random.default_rng(TEACHER_SEED).uniform(-1, 1, size=(WIDTHS[0], WIDTHS[-1])).astype(np.float32)
    rng = np.random.default_rng([DATA_SEED, rank])
    inputs = rng.uniform(-1, 1, size=(SHARD_SAMPLES, WIDTHS[0])).astype(np.float32)
    labels = np.argmax(inputs @ teacher, axis=1)
    return inputs, labels


def train_step(comm, parameters, gradients, inputs, labels, step, nonblocking):
    """One step on this rank's next batch; returns the loss averaged over all ranks' batches."""
    first = step * BATCH % SHARD_SAMPLES
    x, y = inputs[first:first + BATCH], labels[first:first + BATCH]
    w, b = parameters.weights, parameters.biases
    h1 = np.maximum(x @ w[0] + b[0], 0)
    h2 = np.maximum(h1 @ w[1] + b[1], 0)
    logits = (h2 @ w[2] + b[2]).astype(np.float64)

    # Softmax cross-entropy, mean over the local batch; dlogits = (softmax - one_hot) / batch.
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_denominator = np.log(np.exp(shifted).sum(axis=1))
    local_loss = np.array([-(shifted[np.arange(BATCH), y] - log_denominator).mean()], dtype=np.float64)
    probabilities = np.exp(shifted - log_denominator[:, None])
    probabilities[np.arange(BATCH), y] -= 1.0
    dlogits = (probabilities / BATCH).astype(np.float32)

    # Backward pass, last layer first; each gradient is reduced as soon as it is complete (in place).
    gw, gb = gradients.weights, gradients.biases

    def allreduce(tensor):
        comm.Allreduce(MPI.IN_PLACE, tensor, op=MPI.SUM)

    gw[2][...] = h2.T @ dlogits
    gb[2][...] = dlogits.sum(axis=0)
    allreduce(gw[2])
    allreduce(gb[2])
    dh2 = (dlogits @ w[2].T) * (h2 > 0)
    gw[1][...] = h1.T @ dh2
    gb[1][...] = dh2.sum(axis=0)
    # The nonblocking reduction runs while the first layer's backward pass computes; MPI lets other
    # collectives start meanwhile, as long as every rank issues them in the same order.
    pending = None
    if nonblocking:
        pending = comm.Iallreduce(MPI.IN_PLACE, gw[1], op=MPI.SUM)
    else:
        allreduce(gw[1])
    allreduce(gb[1])
    dh1 = (dh2 @ w[1].T) * (h1 > 0)
    gw[0][...] = x.T @ dh1
    gb[0][...] = dh1.sum(axis=0)
    allreduce(gw[0])
    allreduce(gb[0])
    if pending is not None:
        pending.Wait()

    # SGD on the mean gradient: the sums divided by the number of ranks.
    parameters.flat -= (LEARNING_RATE / np.float32(comm.Get_size())) * gradients.flat

    loss = np.zeros(1, dtype=np.float64)
    comm.Allreduce(local_loss, loss, op=MPI.SUM)
    return float(loss[0]) / comm.Get_size()


def fnv1a64(data):
    """FNV-1a, 64 bits, over bytes: equal hashes mean (all but certainly) equal weights."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return value


def main():
    arguments = parse_arguments()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if arguments.print_pid:
        print(f"{PROGRAM}: rank {rank} pid {os.getpid()}", file=sys.stderr, flush=True)

    # Rank 0 draws the initial weights; the broadcast gives every rank the same starting point.
    parameters, gradients = Parameters(), Parameters()
    if rank == 0:
        initialise(parameters)
    comm.Bcast(parameters.flat, root=0)
    inputs, labels = make_shard(rank)

    if rank == 0:
        print(f"mlp {'-'.join(map(str, WIDTHS))}, {parameters.flat.size} parameters, {comm.Get_size()} ranks x "
              f"{BATCH} samples per step, {arguments.steps} steps, "
              f"{'nonblocking' if arguments.nonblocking else 'blocking'}", flush=True)
    loss = 0.0
    for step in range(arguments.steps):
        loss = train_step(comm, parameters, gradients, inputs, labels, step, arguments.nonblocking)
        if rank == 0 and arguments.print_every > 0 and (step + 1) % arguments.print_every == 0:
            print(f"step {step + 1} loss {loss:.6f}", flush=True)
        if arguments.sleep_ms > 0:
            time.sleep(arguments.sleep_ms / 1000.0)
    if rank == 0:
        print(f"final loss {loss.hex()} weights fnv1a64 {fnv1a64(parameters.flat.tobytes()):016x}", flush=True)
    return arguments.exit_code


if __name__ == "__main__":
    status = main()
    # mpi4py finalizes MPI at exit; sys.exit keeps that and sets the status.
    sys.exit(status)
