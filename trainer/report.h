/* What braid-train shows and writes (rank 0 only): a progress bar while an epoch runs (on a
 * terminal), one line per epoch, a CSV of the same rows, and a PNG plot made by gnuplot. */
#ifndef TRAIN_REPORT_H_
#define TRAIN_REPORT_H_

#include <stddef.h>
#include <stdio.h>

typedef struct {
  int epoch;                              /* 1-based */
  double train_loss, train_acc, test_acc; /* accuracies as fractions */
  double samples_per_s;
  double comm_s;   /* all-reduce in flight, mean over ranks */
  double hidden_s; /* of which not waited for after backward */
  double epoch_s;  /* training time of the epoch (rank 0) */
  double lr;       /* at the end of the epoch */
  double sent_mb;  /* training bytes handed to Braid this epoch, MB, mean over ranks */
  double total_mb; /* the same since the start */
  double spread;   /* RMS over parameters of their deviation across ranks (-1: replicas) */
} epoch_row_t;

typedef struct {
  int enabled;
  int epoch, epochs, steps;
  double last_draw;
} progress_t;

void progress_begin(progress_t* p, int enabled, int epoch, int epochs, int steps);
void progress_update(progress_t* p, int step, double mean_loss);
void progress_end(progress_t* p);

void report_epoch_line(FILE* out, const epoch_row_t* row, int epochs);

/* Rewrites the whole CSV from the rows so far (a resumed run keeps the earlier epochs);
 * `scheme` ("allreduce none") goes in every row. */
int report_write_csv(const char* path, const epoch_row_t* rows, int n, const char* scheme,
                     char* err, size_t errlen);

/* Runs gnuplot on the CSV to make a PNG of loss and accuracies per epoch. */
int report_plot(const char* csv, const char* png, const char* title, int epochs, char* err,
                size_t errlen);

#endif /* TRAIN_REPORT_H_ */
