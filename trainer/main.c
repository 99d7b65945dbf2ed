/* braid-train: data-parallel SGD on Fashion-MNIST with Braid's ncclAllReduce. Works out the
 * launch, parses flags, trains, writes the CSV and the plot. */
#include <stdio.h>
#include <stdlib.h>

#include "launch.h"
#include "options.h"
#include "train.h"

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  launch_t launch;
  char err[512];
  if (launch_init(&argc, &argv, &launch, err, sizeof(err)) != 0) {
    fprintf(stderr, "braid-train: %s\n", err);
    return 2;
  }
  options_t o;
  int rc = options_parse(argc, argv, &o, launch.rank == 0);
  if (rc != 0) {
    launch_finish(&launch);
    return rc > 0 ? EXIT_SUCCESS : 2;
  }
  trainer_t t;
  trainer_setup(&t, &o, &launch);
  trainer_run(&t);
  trainer_close_comm(&t);
  launch_finish(&launch); /* before gnuplot: MPI does not like fork() */
  trainer_outputs(&t);
  trainer_teardown(&t);
  return EXIT_SUCCESS;
}
