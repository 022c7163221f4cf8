// The plugin's one entry point: cv::imdecode with OpenCV's own EXIF rotation off (iris applies
// the orientation Pillow would), its exceptions and empty results turned into an error string.
#include "vision/opencv_plugin/opencv_imdecode.h"

#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>

namespace {

using iris::vision::opencv_plugin::Decoded;
using iris::vision::opencv_plugin::Samples;

void Imdecode(const uint8_t* bytes, size_t size, Samples samples, Decoded* out) {
  out->error.clear();
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    out->error = "data over 2 GiB";
    return;
  }
  const bool gray16 = samples == Samples::kGray16;
  const int type = gray16 ? CV_16UC1 : CV_8UC3;
  const int flags = (gray16 ? cv::IMREAD_ANYDEPTH | cv::IMREAD_GRAYSCALE : cv::IMREAD_COLOR) | cv::IMREAD_IGNORE_ORIENTATION;
  const size_t pixel_bytes = gray16 ? 2 : 3;
  try {
    // OpenCV writes into `dst` when its size and type match what the decoder reports.
    const bool sized = out->width > 0 && out->height > 0 &&
                       out->data.size() == static_cast<size_t>(out->width) * out->height * pixel_bytes;
    cv::Mat dst = sized ? cv::Mat(out->height, out->width, type, out->data.data()) : cv::Mat();
    const cv::Mat buf(1, static_cast<int>(size), CV_8UC1, const_cast<uint8_t*>(bytes));
    const cv::Mat decoded = cv::imdecode(buf, flags, &dst);
    if (decoded.empty()) {
      out->error = "OpenCV could not decode it";
      return;
    }
    if (decoded.type() != type) {
      out->error = gray16 ? "OpenCV did not return 16-bit samples" : "OpenCV returned a non-8-bit-BGR image";
      return;
    }
    if (sized && decoded.data == out->data.data()) return;  // decoded in place
    out->width = decoded.cols;
    out->height = decoded.rows;
    const size_t row = static_cast<size_t>(decoded.cols) * pixel_bytes;
    out->data.assign(row * decoded.rows, 0);
    for (int y = 0; y < decoded.rows; ++y) std::memcpy(out->data.data() + y * row, decoded.ptr(y), row);
  } catch (const cv::Exception& e) {
    out->error = std::string("OpenCV: ") + e.what();
  } catch (const std::exception& e) {
    out->error = e.what();
  }
}

}  // namespace

extern "C" __attribute__((visibility("default"))) void iris_opencv_imdecode(const uint8_t* bytes, size_t size,
                                                                            Samples samples, Decoded* out) {
  Imdecode(bytes, size, samples, out);
}
