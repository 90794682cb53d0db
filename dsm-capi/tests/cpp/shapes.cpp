// A C++ check of dsm.h: a virtual call (vptr hooks), a template, std::vector.
#include <cstdio>
#include <vector>
#include "dsm.h"

struct Shape { virtual double area() const = 0; virtual ~Shape() {} };
struct Square : Shape { double s; explicit Square(double s) : s(s) {} double area() const override { return s * s; } };

template <typename T> T *alloc(const char *name, size_t n) { return static_cast<T *>(dsm_alloc(name, sizeof(T), n)); }

int main() {
    if (dsm_init() != DSM_OK) { std::fprintf(stderr, "%s\n", dsm_last_error()); return 2; }
    int rank = dsm_rank(), size = dsm_size();
    double *areas = alloc<double>("areas", static_cast<size_t>(size));
    std::vector<Shape *> shapes{new Square(rank + 1.0)};
    areas[rank] = shapes[0]->area();
    dsm_barrier();
    double total = 0;
    for (int r = 0; r < size; r++) total += areas[r];
    std::printf("rank %d: total %g\n", rank, total);
    for (auto *s : shapes) delete s;
    return dsm_finish();
}
