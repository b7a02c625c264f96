// How fast is Open MPI's all-reduce of a large buffer in one call, and in pieces? The measurement
// behind the piece sizes of exec/runtime/mpi_communicator.cpp (docs/BENCHMARKS.md). Standalone, not part
// of the build:
//   mpicxx -O2 bench/mpi_allreduce_pieces.cpp -o /tmp/allreduce_pieces
//   mpirun -np 2 /tmp/allreduce_pieces [FLOATS]      (default 12.6 M, the small shape's gradients)
// Non-blocking all-reduces are waited for as ptdp's polling waits do (MPI_Test, yielding between
// tests); the blocking MPI_Allreduce is shown for comparison. Best of 5 per row.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

double best_of_5(const std::vector<float>& init, std::vector<float>& buf, size_t piece, bool blocking) {
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    buf = init;
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (size_t off = 0; off < buf.size(); off += piece) {
      const int len = static_cast<int>(std::min(piece, buf.size() - off));
      if (blocking) {
        MPI_Allreduce(MPI_IN_PLACE, buf.data() + off, len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        continue;
      }
      MPI_Request req;
      MPI_Iallreduce(MPI_IN_PLACE, buf.data() + off, len, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
      for (int done = 0; !done;) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        if (!done) sched_yield();
      }
    }
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    best = std::min(best, t);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 12600000;
  const std::vector<float> init(n, 1.0f);
  std::vector<float> buf;
  if (rank == 0) std::printf("all-reduce of %zu floats (%.1f MiB)\n", n, n * 4.0 / (1 << 20));
  for (bool blocking : {false, true})
    for (size_t piece_bytes : {n * 4, size_t{16} << 20, size_t{4} << 20, size_t{1} << 20, size_t{512} << 10,
                               size_t{256} << 10, size_t{64} << 10}) {
      const double s = best_of_5(init, buf, std::max<size_t>(1, piece_bytes / 4), blocking);
      if (rank == 0)
        std::printf("%-12s pieces of %8.3f MiB: %7.2f ms\n", blocking ? "blocking" : "non-blocking",
                    std::min(piece_bytes, n * 4) / double(1 << 20), s * 1e3);
    }
  MPI_Finalize();
  return 0;
}
