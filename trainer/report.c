/* Output of braid-train. The CSV is rewritten atomically after every epoch so it is always
 * whole; gnuplot reads it by column name. */
#include "report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buckets.h"

#define BAR_WIDTH 30
#define BAR_REDRAW_S 0.1

void progress_begin(progress_t* p, int enabled, int epoch, int epochs, int steps) {
  p->enabled = enabled;
  p->epoch = epoch;
  p->epochs = epochs;
  p->steps = steps;
  p->last_draw = 0;
}

void progress_update(progress_t* p, int step, double mean_loss) {
  if (!p->enabled) return;
  double now = buckets_now();
  if (step < p->steps && now - p->last_draw < BAR_REDRAW_S) return;
  p->last_draw = now;
  int fill = p->steps ? (int)((long long)BAR_WIDTH * step / p->steps) : BAR_WIDTH;
  char bar[BAR_WIDTH + 1];
  for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
  bar[BAR_WIDTH] = '\0';
  fprintf(stderr, "\repoch %d/%d [%s] %d/%d loss %.4f ", p->epoch, p->epochs, bar, step, p->steps,
          mean_loss);
  fflush(stderr);
}

void progress_end(progress_t* p) {
  if (!p->enabled) return;
  fprintf(stderr, "\r%*s\r", BAR_WIDTH + 60, "");
  fflush(stderr);
}

void report_epoch_line(FILE* out, const epoch_row_t* r, int epochs) {
  const double hidden_pct = r->comm_s > 0 ? 100.0 * r->hidden_s / r->comm_s : 0.0;
  fprintf(out,
          "epoch %2d/%d  loss %.4f  train acc %6.2f%%  test acc %6.2f%%  %8.0f samples/s  "
          "%6.2f s  comm %.2f s (hidden %.2f s, %.0f%%)  lr %.4g  sent %.1f MB",
          r->epoch, epochs, r->train_loss, 100.0 * r->train_acc, 100.0 * r->test_acc,
          r->samples_per_s, r->epoch_s, r->comm_s, r->hidden_s, hidden_pct, r->lr, r->sent_mb);
  if (r->spread >= 0) fprintf(out, "  spread %.3g", r->spread);
  fputc('\n', out);
  fflush(out);
}

int report_write_csv(const char* path, const epoch_row_t* rows, int n, const char* scheme,
                     char* err, size_t errlen) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  if (f == NULL) {
    snprintf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    return -1;
  }
  fprintf(f,
          "epoch,train_loss,train_acc,test_acc,samples_per_s,epoch_s,comm_s,hidden_s,lr,"
          "scheme,sent_mb,total_mb,spread\n");
  for (int i = 0; i < n; i++) {
    const epoch_row_t* r = &rows[i];
    fprintf(f, "%d,%.6f,%.6f,%.6f,%.1f,%.3f,%.3f,%.3f,%.6g,%s,%.3f,%.3f,%.6g\n", r->epoch,
            r->train_loss, r->train_acc, r->test_acc, r->samples_per_s, r->epoch_s, r->comm_s,
            r->hidden_s, r->lr, scheme, r->sent_mb, r->total_mb, r->spread);
  }
  int bad = ferror(f);
  bad |= fclose(f) != 0;
  if (bad || rename(tmp, path) != 0) {
    snprintf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* gnuplot quoting: single-quoted strings, with quotes doubled. */
static void quote(char* out, size_t outlen, const char* s) {
  size_t j = 0;
  if (outlen < 3) return;
  out[j++] = '\'';
  for (; *s && j + 3 < outlen; s++) {
    if (*s == '\'') out[j++] = '\'';
    out[j++] = *s;
  }
  out[j++] = '\'';
  out[j] = '\0';
}

int report_plot(const char* csv, const char* png, const char* title, int epochs, char* err,
                size_t errlen) {
  char qcsv[4200], qpng[4200], qtitle[600];
  quote(qcsv, sizeof(qcsv), csv);
  quote(qpng, sizeof(qpng), png);
  quote(qtitle, sizeof(qtitle), title);
  FILE* g = popen("gnuplot 2>&1", "w");
  if (g == NULL) {
    snprintf(err, errlen, "cannot run gnuplot: %s", strerror(errno));
    return -1;
  }
  fprintf(g,
          "set terminal pngcairo size 1000,420 noenhanced\n"
          "set output %s\n"
          "set datafile separator ','\n"
          "set key autotitle columnhead\n"
          "set multiplot layout 1,2 title %s\n"
          "set xlabel 'epoch'\n"
          "set xrange [0.5:%d.5]\n"
          "%s\n"
          "set ylabel 'train loss'\n"
          "set yrange [0:*]\n"
          "set grid\n"
          "plot %s using 'epoch':'train_loss' with linespoints title 'train loss'\n"
          "set ylabel 'accuracy (%%)'\n"
          "set yrange [*:100]\n"
          "set key bottom right\n"
          "plot %s using 'epoch':(100*column('train_acc')) with linespoints title 'train', "
          "'' using 'epoch':(100*column('test_acc')) with linespoints title 'test'\n"
          "unset multiplot\n",
          qpng, qtitle, epochs, epochs <= 20 ? "set xtics 1" : "", qcsv, qcsv);
  int status = pclose(g);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    int code = (status != -1 && WIFEXITED(status)) ? WEXITSTATUS(status) : -1;
    snprintf(err, errlen, "gnuplot failed (exit %d)%s", code,
             code == 127 ? ": not installed? (Debian: gnuplot-nox)" : "");
    return -1;
  }
  return 0;
}
