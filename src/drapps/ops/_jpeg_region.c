/* Region decode of a JPEG with libjpeg-turbo's libjpeg API: only the rows and iMCU columns a
 * crop needs, optionally at a reduced DCT scale (1/2, 1/4, 1/8).
 *
 * decode_region(data, top, left, height, width, denom) -> (pixels, rows, cols, channels, x0)
 *
 * The box (top, left, height, width) is in the scaled image's pixels. Rows above it are skipped
 * (jpeg_skip_scanlines: entropy-decoded, not transformed), the decode stops after its last row,
 * and jpeg_crop_scanline limits the inverse DCT, upsampling and colour conversion to the iMCU
 * columns that cover it. The pixels come back as bytes of `rows` x `cols` x 3 (RGB, uint8) for
 * the widened columns; the box starts `x0` columns in. The GIL is released while decoding.
 *
 * Errors and warnings (corrupt data) raise ValueError with libjpeg's message, as simplejpeg's
 * strict decode does; corruption below the box is never read, so it goes unnoticed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf escape;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo) {
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->escape, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    /* A warning (corrupt data) is an error, as in simplejpeg's strict decode; traces are dropped. */
    if (level < 0) {
        on_error(cinfo);
    }
}

/* What one decode needs and returns, so the decode itself runs without the GIL. */
typedef struct {
    const unsigned char *data;
    unsigned long size;
    long top, left, height, width;
    int denom;
    unsigned char *out; /* malloc'd: rows * cols * 3 */
    long rows, cols, x0;
    int unsupported; /* a colour space libjpeg cannot turn into RGB (CMYK, YCCK) */
    char message[JMSG_LENGTH_MAX];
} job_t;

static int run(job_t *job) {
    struct jpeg_decompress_struct cinfo;
    error_mgr err;
    JSAMPROW row;
    JDIMENSION xoffset, width;
    long y, end;

    job->out = NULL;
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    err.message[0] = '\0';
    if (setjmp(err.escape)) {
        strncpy(job->message, err.message, sizeof(job->message) - 1);
        job->message[sizeof(job->message) - 1] = '\0';
        jpeg_destroy_decompress(&cinfo);
        free(job->out);
        job->out = NULL;
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, job->data, job->size);
    jpeg_read_header(&cinfo, TRUE);
    if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
        job->unsupported = 1;
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)job->denom;
    /* TurboJPEG's defaults, which simplejpeg's decode uses: accurate integer IDCT, fancy
     * upsampling. */
    cinfo.dct_method = JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    jpeg_start_decompress(&cinfo);
    if (job->top < 0 || job->left < 0 || job->height < 1 || job->width < 1 ||
        job->top + job->height > (long)cinfo.output_height ||
        job->left + job->width > (long)cinfo.output_width) {
        snprintf(job->message, sizeof(job->message),
                 "box (top=%ld, left=%ld, height=%ld, width=%ld) is outside the %ux%u image "
                 "decoded at 1/%d",
                 job->top, job->left, job->height, job->width, cinfo.output_height,
                 cinfo.output_width, job->denom);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    /* One column more on each side than the box: the upsampler treats the edges of the decoded
     * columns as the image's edges, so a box column next to them would be smoothed against
     * itself instead of its neighbour, unlike the whole-image decode. */
    xoffset = (JDIMENSION)(job->left > 0 ? job->left - 1 : 0);
    width = (JDIMENSION)(job->left + job->width) - xoffset;
    if (job->left + job->width < (long)cinfo.output_width) {
        width += 1;
    }
    if (width < cinfo.output_width) {
        jpeg_crop_scanline(&cinfo, &xoffset, &width);
    } else {
        xoffset = 0;
    }
    job->rows = job->height;
    job->cols = (long)width;
    job->x0 = job->left - (long)xoffset;
    job->out = (unsigned char *)malloc((size_t)job->rows * (size_t)job->cols * 3);
    if (job->out == NULL) {
        snprintf(job->message, sizeof(job->message), "out of memory");
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    if (job->top > 0) {
        jpeg_skip_scanlines(&cinfo, (JDIMENSION)job->top);
    }
    end = job->top + job->height;
    for (y = job->top; y < end;) {
        row = job->out + (size_t)(y - job->top) * (size_t)job->cols * 3;
        y += (long)jpeg_read_scanlines(&cinfo, &row, 1);
    }
    /* The rows below the box are never decoded. */
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer buffer;
    job_t job;
    PyObject *pixels;
    int status;

    (void)self;
    memset(&job, 0, sizeof(job));
    if (!PyArg_ParseTuple(args, "y*lllli", &buffer, &job.top, &job.left, &job.height, &job.width,
                          &job.denom)) {
        return NULL;
    }
    if (job.denom != 1 && job.denom != 2 && job.denom != 4 && job.denom != 8) {
        PyBuffer_Release(&buffer);
        PyErr_Format(PyExc_ValueError, "denom must be 1, 2, 4 or 8, got %d", job.denom);
        return NULL;
    }
    job.data = (const unsigned char *)buffer.buf;
    job.size = (unsigned long)buffer.len;
    Py_BEGIN_ALLOW_THREADS
    status = run(&job);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buffer);
    if (status != 0) {
        if (job.unsupported) {
            PyErr_SetString(PyExc_NotImplementedError,
                            "CMYK and YCCK JPEGs are not region-decoded to RGB");
        } else {
            PyErr_Format(PyExc_ValueError, "not a JPEG that libjpeg-turbo can read: %s",
                         job.message);
        }
        return NULL;
    }
    pixels = PyBytes_FromStringAndSize((const char *)job.out, job.rows * job.cols * 3);
    free(job.out);
    if (pixels == NULL) {
        return NULL;
    }
    return Py_BuildValue("(Nllil)", pixels, job.rows, job.cols, 3, job.x0);
}

static PyObject *library_version(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef LIBJPEG_TURBO_VERSION
#define STR2(x) #x
#define STR(x) STR2(x)
    return PyUnicode_FromString("libjpeg-turbo " STR(LIBJPEG_TURBO_VERSION));
#else
    return PyUnicode_FromFormat("libjpeg %d", JPEG_LIB_VERSION);
#endif
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, top, left, height, width, denom) -> (pixels, rows, cols, channels, "
     "x0): the box of a JPEG decoded at 1/denom scale, RGB uint8, widened to iMCU columns."},
    {"library_version", library_version, METH_NOARGS, "The libjpeg this module was built on."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_jpeg_region",
    "Region decode of JPEGs with libjpeg-turbo (drapps.ops.decode_crop uses it).", -1, methods,
};

PyMODINIT_FUNC PyInit__jpeg_region(void) { return PyModule_Create(&module); }
